"""``PluginHost``: the host as a plugin sees it, the ``host`` of every hook and ``ctx.host``.

A protocol, and the whole of what a plugin may use of the host, each part documented here;
the host's own objects (its registry, scheduler, convergence, routes, plugin manager) stay
free to change shape. ``millm_host.host_view.HostView`` is the one implementation. The
functions of ``millm_host.api`` that take a ``host`` (``add_converger``, ``admin_activity``,
``stateless_monitor_results``, …) take this too.

A leaf of the host's import graph: it names no host module that could name it back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from .db import Database
    from .engine import Engine
    from .observability.series import Series
    from .settings import Settings

T = TypeVar("T")


class EngineSlot(Protocol):
    """Admitted work on one model: a queue place, a lease on the model, the engine thread."""

    @property
    def engine(self) -> Engine:
        """The resident model's engine, held for the slot's life."""
        ...

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the engine thread, in queue order."""
        ...


class PluginMetrics(Protocol):
    """What a plugin records: series it names ``millm_<plugin>_...``, and events on a request's span."""

    def counter(self, name: str, documentation: str, labels: Iterable[str] = ()) -> Series:
        """A counter (``.inc(amount, **labels)``); the same name gives the same series."""
        ...

    def histogram(
        self, name: str, documentation: str, labels: Iterable[str] = (), buckets: Iterable[float] = ...
    ) -> Series:
        """A histogram (``.observe(value, **labels)``, seconds by convention); the same name, the same series."""
        ...

    def trace_events(self, ctx: object, results: Iterable[Mapping[str, Any]], default_name: str) -> None:
        """Each result becomes an event of the span of the request ``ctx`` (a ``RequestContext``), named
        by its ``schema`` (never any text)."""
        ...


class PluginHost(Protocol):
    """What a plugin may use of the host (see the module docstring)."""

    # --- the plugin's own state and the shared stores ------------------------------------
    @property
    def settings(self) -> Settings:
        """Every declared setting (the host's and every plugin's): ``host.settings["NAME"]``."""
        ...

    @property
    def state(self) -> dict[str, Any]:
        """Per-plugin objects for this host: ``host.state[<plugin name>]``, made at ``startup``."""
        ...

    @property
    def db(self) -> Database:
        """The database: ``host.db.session()`` is a SQLAlchemy session for the plugin's own tables."""
        ...

    @property
    def metrics(self) -> PluginMetrics:
        """Series a plugin names for ``/metrics`` (``counter``, ``histogram``) and span events (``trace_events``)."""
        ...

    @property
    def app(self) -> Any:
        """The ASGI app, for a plugin that serves pages from the API's own answers in process (the web UI)."""
        ...

    # --- the models ---------------------------------------------------------------------
    def engine_slot(self, model_id: str) -> AbstractAsyncContextManager[EngineSlot]:
        """``async with host.engine_slot(model_id) as slot: await slot.run(fn, ...)``: work on the engine
        thread with a queue place and a lease on the model (loaded first if needed). Refused like a
        request (``queue_full``, ``model_busy``, ``model_not_loaded``)."""
        ...

    async def run_on_engine_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the engine thread, in order with loads, unloads and requests, without a queue
        place or a lease (to publish state serialised with an unload)."""
        ...

    def model_detail(self, model_id: str) -> dict[str, Any]:
        """A model's state and identity, as ``GET /api/models/{id}`` reports it (404 for an unknown id)."""
        ...

    def current_model(self) -> tuple[Engine, str]:
        """The resident engine and its model id; ``503`` (model_not_loaded, or model_busy while one loads)."""
        ...

    def resident_engine(self) -> Engine | None:
        """The resident engine, or None (no answer is refused: compare it with one held to see a reload)."""
        ...

    def resident_model_id(self) -> str | None:
        """The id of the resident model, or None."""
        ...

    def still_resident(self, engine: Engine) -> bool:
        """Whether ``engine`` is resident and no unload of it has begun (attach nothing to it otherwise)."""
        ...

    def resolve_model_id(self, name: str) -> str:
        """The id a model name (an id, or an alias) stands for; 404 for an unknown one."""
        ...
