"""``HostView``: the one implementation of ``PluginHost`` (``millm_host.plugin_host``), over the host.

The host hands this view to every hook (``host``) and request (``ctx.host``); a plugin never holds
the host itself. ``host_of`` gives the host's own modules that serve ``millm_host.api`` the host
behind a view.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    import pluggy

    from .admission import Admission
    from .db import Database
    from .engine import Engine
    from .fields import FieldRegistry
    from .observability.metrics import Metrics
    from .openapi import RouteTable
    from .plugin_host import PluginHost
    from .registry import ModelRegistry
    from .replicas.convergence import Convergence
    from .settings import Settings

T = TypeVar("T")


class _Host(Protocol):
    """What the view (and ``millm_host.api``'s host-side functions) use of ``millm_host.app.Host``."""

    settings: Settings
    state: dict[str, Any]
    db: Database
    metrics: Metrics
    routes: RouteTable | None
    registry: ModelRegistry
    convergence: Convergence
    fields: FieldRegistry
    pm: pluggy.PluginManager

    def engine_slot(self, model: str) -> AbstractAsyncContextManager[Admission]: ...

    async def run_on_engine_thread(self, fn: Callable[..., T], *args: Any) -> T: ...

    def model_detail(self, model_id: str) -> dict[str, Any]: ...


class HostView:
    """``PluginHost`` over the host: each member is documented there."""

    __slots__ = ("_host",)

    def __init__(self, host: _Host) -> None:
        self._host = host

    # --- the plugin's own state and the shared stores ------------------------------------
    @property
    def settings(self) -> Settings:
        return self._host.settings

    @property
    def state(self) -> dict[str, Any]:
        return self._host.state

    @property
    def db(self) -> Database:
        return self._host.db

    @property
    def metrics(self) -> Metrics:
        return self._host.metrics

    @property
    def app(self) -> Any:
        routes = self._host.routes
        assert routes is not None, "the routes are installed before any plugin's route is served"
        return routes.app

    # --- the models ---------------------------------------------------------------------
    def engine_slot(self, model_id: str) -> AbstractAsyncContextManager[Admission]:
        return self._host.engine_slot(model_id)

    async def run_on_engine_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._host.run_on_engine_thread(fn, *args)

    def model_detail(self, model_id: str) -> dict[str, Any]:
        return self._host.model_detail(model_id)

    def current_model(self) -> tuple[Engine, str]:
        engine, entry = self._host.registry.current()
        return engine, entry.id

    def resident_engine(self) -> Engine | None:
        return self._host.registry.engine

    def resident_model_id(self) -> str | None:
        resident = self._host.registry.resident
        return resident.id if resident is not None else None

    def still_resident(self, engine: Engine) -> bool:
        return bool(self._host.registry.still_resident(engine))

    def resolve_model_id(self, name: str) -> str:
        return self._host.registry.resolve(name).id


def host_of(view: PluginHost | _Host) -> _Host:
    """The ``Host`` behind a plugin's view (for the host's own modules that serve ``millm_host.api``)."""
    return view._host if isinstance(view, HostView) else view  # type: ignore[return-value]
