"""``PluginHost``: the host as a plugin sees it, the ``host`` of every hook and ``ctx.host``.

Plugins get this narrow view, never the ``Host`` itself: what is here is the whole of
what a plugin may use of the host, each part documented, and the host's own objects
(its registry, scheduler, convergence, routes, plugin manager) stay free to change shape.
The functions of ``millm_host.api`` that take a ``host`` (``add_converger``,
``admin_activity``, ``stateless_monitor_results``, …) take this view too.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .admission import Admission
    from .app import Host
    from .db import Database
    from .engine import Engine
    from .observability.metrics import Metrics
    from .settings import Settings

T = TypeVar("T")


class PluginHost:
    """What a plugin may use of the host (see the module docstring)."""

    __slots__ = ("_host",)

    def __init__(self, host: Host) -> None:
        self._host = host

    # --- the plugin's own state and the shared stores ------------------------------------
    @property
    def settings(self) -> Settings:
        """Every declared setting (the host's and every plugin's): ``host.settings["NAME"]``."""
        return self._host.settings

    @property
    def state(self) -> dict[str, Any]:
        """Per-plugin objects for this host: ``host.state[<plugin name>]``, made at ``startup``."""
        return self._host.state

    @property
    def db(self) -> Database:
        """The database: ``host.db.session()`` is a SQLAlchemy session for the plugin's own tables."""
        return self._host.db

    @property
    def metrics(self) -> Metrics:
        """Series a plugin names for ``/metrics`` (``counter``, ``histogram``) and span events (``trace_events``)."""
        return self._host.metrics

    @property
    def app(self) -> Any:
        """The ASGI app, for a plugin that serves pages from the API's own answers in process (the web UI)."""
        routes = self._host.routes
        assert routes is not None, "the routes are installed before any plugin's route is served"
        return routes.app

    # --- the models ---------------------------------------------------------------------
    def engine_slot(self, model_id: str) -> AbstractAsyncContextManager[Admission]:
        """``async with host.engine_slot(model_id) as slot: await slot.run(fn, ...)``: work on the engine
        thread with a queue place and a lease on the model (loaded first if needed)."""
        return self._host.engine_slot(model_id)

    async def run_on_engine_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the engine thread, in order with loads, unloads and requests, without a queue
        place or a lease (to publish state serialised with an unload)."""
        return await self._host.run_on_engine_thread(fn, *args)

    def model_detail(self, model_id: str) -> dict[str, Any]:
        """A model's state and identity, as ``GET /api/models/{id}`` reports it (404 for an unknown id)."""
        return self._host.model_detail(model_id)

    def current_model(self) -> tuple[Engine, str]:
        """The resident engine and its model id; ``503`` (model_not_loaded, or model_busy while one loads)."""
        engine, entry = self._host.registry.current()
        return engine, entry.id

    def resident_engine(self) -> Engine | None:
        """The resident engine, or None (no answer is refused: compare it with one held to see a reload)."""
        return self._host.registry.engine

    def resident_model_id(self) -> str | None:
        """The id of the resident model, or None."""
        resident = self._host.registry.resident
        return resident.id if resident is not None else None

    def still_resident(self, engine: Engine) -> bool:
        """Whether ``engine`` is resident and no unload of it has begun (attach nothing to it otherwise)."""
        return bool(self._host.registry.still_resident(engine))

    def resolve_model_id(self, name: str) -> str:
        """The id a model name (an id, or an alias) stands for; 404 for an unknown one."""
        return self._host.registry.resolve(name).id


def host_of(view: PluginHost | Host) -> Host:
    """The ``Host`` behind a plugin's view (for the host's own modules that serve ``millm_host.api``)."""
    return view._host if isinstance(view, PluginHost) else view
