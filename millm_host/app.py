"""The host: services shared by routes and plugins, and the Falcon ASGI app."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import falcon
import falcon.asgi
import pluggy
from pydantic import BaseModel

from . import hookcalls
from .access import Access
from .adapters import AdapterRegistry
from .admission import Admission, engine_slot
from .batch_api.runner import BatchRunner
from .batch_api.store import FileStore
from .bodies import collector
from .bodies.encode import PiecewiseJSONHandler
from .bodies.timeout import App
from .db import Database, database_url
from .draining import Draining
from .engine import EngineSpec
from .errors import MillmError
from .fields import ENDPOINTS, FieldRegistry
from .host_view import HostView
from .intake import IntakeGate
from .observability.ids import RequestIdsMiddleware
from .observability.metrics import Metrics
from .observability.request import CURRENT, Observation
from .observability.tracing import Tracing
from .plugins import build_plugin_manager
from .registry import ModelRegistry
from .replicas.convergence import Convergence
from .scheduler import Scheduler
from .serving.base import Serving
from .serving.chat import ServingChat
from .serving.completion import ServingCompletion
from .serving.embeddings import ServingEmbeddings
from .serving.messages_api import ServingCountTokens, ServingMessages
from .serving.responses_api import ServingResponses
from .serving.tokens import ServingDetokenize, ServingTokenize
from .settings import Settings

if TYPE_CHECKING:
    from .openapi import RouteTable
    from .plugin_host import PluginHost
    from .serving.run import Flight

log = logging.getLogger("millm")

T = TypeVar("T")
#: Seconds ``stop`` waits for the engine thread to finish what was cancelled (plugins hear of it)
#: before the plugins stop; past it the thread is hung and left behind (it is a daemon thread).
DRAIN_S = 5.0
BATCH_MIGRATIONS = Path(__file__).parent / "batch_api" / "migrations"
REPLICA_MIGRATIONS = Path(__file__).parent / "replicas" / "migrations"


class Host:
    """Everything a route or a plugin needs: settings, plugins, models, queue, database."""

    def __init__(self, settings: Settings, pm: pluggy.PluginManager) -> None:
        self.settings = settings
        self.pm = pm
        self.report = pm.millm_report  # type: ignore[attr-defined]
        #: Every installed engine (``build_plugin_manager`` collected them and declared their settings).
        self.engines: list[EngineSpec] = list(pm.millm_engines)  # type: ignore[attr-defined]
        self.fields = FieldRegistry(self.engines)
        hookcalls.startup(pm, "register_request_fields", register=self.fields.register)
        self.scheduler = Scheduler(settings["MILLM_QUEUE_MAX"], settings["MILLM_GENERATION_STALL_S"])
        #: Paces new requests' intake while a generation runs (``MILLM_INTAKE_SHARE``).
        self.intake = IntakeGate(settings["MILLM_INTAKE_SHARE"], self._generating_here)
        #: Generations under way (``serving.run.Flight``): the end of the shutdown grace stops them all at once.
        self.flights: set[Flight] = set()
        #: Prometheus metrics (``/metrics``); plugins record through its methods (see ``millm_host.api``).
        self.metrics = Metrics()
        #: OpenTelemetry spans, when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (``tracing.enabled``).
        self.tracing = Tracing(settings["OTEL_EXPORTER_OTLP_ENDPOINT"], settings["OTEL_SERVICE_NAME"])
        if settings["MILLM_METRICS"]:
            self.scheduler.watch = self.metrics.queue_changed
        self.registry = ModelRegistry(self, self.engines)
        #: LoRA adapters served on the models (``MILLM_LORA_DIRS`` and ``/api/models/{id}/adapters``).
        self.adapters = AdapterRegistry(self.registry, settings)
        self.db = Database(database_url(settings))
        #: This replica's convergence to the desired state in the database (armed probes, steering);
        #: plugins add their convergers at ``startup``.
        self.convergence = Convergence(self)
        #: The Batch API: uploaded files and the batches run over them.
        self.batches = BatchRunner(self, FileStore(settings.data_dir / "files", self.db))
        #: One request lifecycle per endpoint: ``await host.serving[endpoint].handle(body, headers)``
        #: (chat and completions hand scoring-mode bodies to their ``.scoring``).
        self.serving: dict[str, Serving] = {
            serving.endpoint: serving
            for serving in (
                ServingChat(self),
                ServingCompletion(self),
                ServingEmbeddings(self),
                ServingTokenize(self),
                ServingDetokenize(self),
            )
        }
        self.serving[ServingResponses.route] = ServingResponses(self)  # served as chat, under its own route
        self.serving[ServingMessages.route] = ServingMessages(self)  # Anthropic's, served as chat too
        self.serving[ServingCountTokens.route] = ServingCountTokens(self)
        #: Each plugin's per-host object under its own key (``host.state["steering"]``), made at
        #: ``startup``; like ``ctx.state``, a plugin never reads another's.
        self.state: dict[str, Any] = {}
        #: What plugins see of this host: the ``host`` of every hook and ``ctx.host``.
        self.plugin_host: PluginHost = HostView(self)
        #: endpoint → plugin models of the request fields it adds, for ``/openapi.json``.
        self.request_schemas: dict[str, list[type[BaseModel]]] = {}
        hookcalls.startup(pm, "register_request_schemas", register=self._register_request_schema)
        #: Extra (path, pydantic model) request bodies for ``/openapi.json``, for a POST route whose
        #: responder is not described (``millm_host.api.operation`` describes it fully).
        self.openapi_bodies: list[tuple[str, type[BaseModel]]] = []
        #: Every route, the host's and the plugins' (filled while the app is built).
        self.routes: RouteTable | None = None
        self._load_task: asyncio.Task | None = None
        self._background: set[asyncio.Task] = set()

    def _register_request_schema(self, endpoint: str, model: type[BaseModel]) -> None:
        if endpoint not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {endpoint!r}; expected one of {ENDPOINTS}")
        self.request_schemas.setdefault(endpoint, []).append(model)

    # --- what plugins use (see millm_host.api) ----------------------------------------
    def engine_slot(self, model: str) -> AbstractAsyncContextManager[Admission]:
        """Admitted engine work on ``model`` (an id): a queue place, a lease, the engine thread.

        ``async with host.engine_slot(model_id) as slot: result = await slot.run(fn, *args)``;
        ``slot.engine`` is the resident model. Refused like a request (``queue_full``,
        ``model_busy``, ``model_not_loaded``); a model that is not resident is loaded
        first when ``MILLM_AUTOLOAD`` allows.
        """
        return engine_slot(self, model)

    async def run_on_engine_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the engine thread, in order with loads, unloads and requests, without
        a queue place or a lease (e.g. to publish state serialised with an unload)."""
        return await self.scheduler.run(fn, *args)

    def model_detail(self, model_id: str) -> dict[str, Any]:
        """A model's state and identity, as ``GET /api/models/{id}`` reports it (404 for an unknown id)."""
        return self.registry.detail(self.registry.by_id(model_id))

    def listed_models(self) -> list[Any]:
        """What ``/v1/models`` lists: the registry's listing, narrowed by any plugin (e.g. a steering lock)."""
        entries = self.registry.listed()
        keep = {e.id for e in entries}
        for allowed in hookcalls.request(
            self.pm, "filter_listed_models", host=self.plugin_host, model_ids=[e.id for e in entries]
        ):
            if allowed is not None:
                keep &= set(allowed)
        return [e for e in entries if e.id in keep]

    def _generating_here(self) -> bool:
        """A generation runs whose decode steps share this process's interpreter lock (the intake gate's test)."""
        engine = self.registry.engine
        return self.scheduler.generating and engine is not None and engine.steps_in_process

    def observe(self, endpoint: str, headers: Mapping[str, str]) -> Observation | None:
        """A request's ``Observation`` (None when metrics, tracing and JSON logs are all off)."""
        settings = self.settings
        if not (settings["MILLM_METRICS"] or self.tracing.enabled or settings["MILLM_LOG_FORMAT"] == "json"):
            return None
        if CURRENT.get() is not None:  # already observed (a body served inside another request)
            return None
        return Observation(self, endpoint, headers)

    def keep(self, task: asyncio.Task) -> None:
        """Hold a background task until it ends (the event loop keeps only weak references)."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def migrations(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = [  # the host's own tables
            ("batch", str(BATCH_MIGRATIONS)),
            ("replicas", str(REPLICA_MIGRATIONS)),
        ]
        hookcalls.startup(self.pm, "register_migrations", register=lambda name, path: found.append((name, str(path))))
        return found

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Migrate the database (or check it is migrated), discover models and let plugins load their state."""
        if self.settings["MILLM_DB_MIGRATE"]:
            self.db.upgrade(self.migrations())
        else:
            self.db.check_at_head(self.migrations())
        self.registry.discover()
        self.adapters.discover()
        hookcalls.startup(self.pm, "startup", host=self.plugin_host)

    async def load_start_model(self) -> None:
        """Load the start model; then the start-up is over and the garbage collector runs again."""
        try:
            await self._load_start_model()
        finally:
            collector.end_startup()

    async def _load_start_model(self) -> None:
        entry = self.registry.start_model
        if entry is None or not self.settings["MILLM_LOAD_ON_START"]:
            return
        try:
            await self.registry.load(entry)
        except MillmError as exc:
            log.error("the start model %s failed to load: %s", entry.id, exc.message)

    def begin_shutdown(self) -> None:
        """A shutdown signal arrived: refuse new requests, give the admitted ones ``MILLM_SHUTDOWN_GRACE_S``.

        Requests still running or queued when the grace ends are cancelled: a
        stream gets an error event, then ``[DONE]``; any other request a
        ``503 shutting_down``. Safe to call from a signal handler; repeats are ignored.
        """
        scheduler = self.scheduler
        if scheduler.closing:
            return
        grace = self.settings["MILLM_SHUTDOWN_GRACE_S"]
        scheduler.deadline = time.monotonic() + grace
        scheduler.closing = True
        log.info("shutting down: %d admitted requests get %g s to finish", scheduler.admitted, grace)

    def drained(self) -> bool:
        """After ``begin_shutdown``: whether the listener may close. Nothing admitted is left, or the
        grace and a second more have passed (a hung engine thread does not hold the process)."""
        scheduler = self.scheduler
        if not scheduler.closing or scheduler.deadline is None:
            return False
        return scheduler.admitted == 0 or time.monotonic() > scheduler.deadline + 1

    def stop(self) -> None:
        """Release everything: plugins stop, the model is closed, the database let go."""
        drained = self.scheduler.drain(DRAIN_S)  # cancelled generations tell their plugins first
        if not drained:
            log.error(
                "the engine thread is still busy after %g s (a hung generation or a load); stopping without it", DRAIN_S
            )
        hookcalls.lifecycle(self.pm, "shutdown", host=self.plugin_host)
        if self.registry.engine is not None and drained:
            engine = self.registry.engine
            try:
                self.scheduler.run_sync(engine.close, timeout=DRAIN_S)
            except Exception:
                log.exception("closing the model failed")
        self.scheduler.shutdown()
        self.tracing.shutdown()
        self.db.dispose()


class _Lifespan:
    """ASGI lifespan: start loading the start model without blocking the listener."""

    def __init__(self, host: Host) -> None:
        self.host = host

    async def process_startup(self, scope: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        self.host._load_task = asyncio.create_task(self.host.load_start_model())
        self.host.batches.resume()  # batches a stop or a crash left unfinished
        self.host.convergence.start()

    async def process_shutdown(self, scope: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        task = self.host._load_task
        if task is not None and not task.done():
            task.cancel()
        await self.host.batches.stop()  # their unfinished lines stay pending for the next start
        await self.host.convergence.stop()
        await asyncio.to_thread(self.host.stop)


def build(
    settings: Settings | None = None, pm: pluggy.PluginManager | None = None, *, bind_host: str | None = None
) -> tuple[falcon.asgi.App, Host]:
    """The ASGI app and its host. Tests pass their own settings and plugin manager.

    ``bind_host`` (the address ``millm serve`` listens on) is answered as a ``Host`` too.
    """
    from . import routes

    settings = settings or Settings()
    # Each time the event loop wakes it waits for the GIL; a worker thread parsing a large body
    # gives it up only after the switch interval, so the interval bounds every such wait.
    sys.setswitchinterval(settings["MILLM_GIL_SWITCH_MS"] / 1000)
    pm = pm or build_plugin_manager(settings)
    host = Host(settings, pm)
    host.start()
    access = Access(settings, bind_host)
    middleware: list = [RequestIdsMiddleware(), access, Draining(host.scheduler), _Lifespan(host)]
    if access.cors_any or access.cors_origins:
        middleware.append(
            falcon.CORSMiddleware(allow_origins="*" if access.cors_any else access.cors_origins, expose_headers="*")
        )
    app = App(middleware=middleware, cors_enable=False, body_timeout_s=settings["MILLM_BODY_TIMEOUT_S"])
    app.req_options.strip_url_path_trailing_slash = True
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = PiecewiseJSONHandler()  # large bodies off the loop
    routes.install(app, host)
    return app, host


def create_app(settings: Settings | None = None, pm: pluggy.PluginManager | None = None) -> falcon.asgi.App:
    """The ASGI app (``gunicorn -k uvicorn_worker.UvicornWorker 'millm_host.app:create_app()'``)."""
    return build(settings, pm)[0]
