"""The host: services shared by routes and plugins, and the Falcon ASGI app."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import falcon
import falcon.asgi
import pluggy

from .db import Database, database_url
from .engine import EngineSpec
from .errors import MillmError
from .fields import FieldRegistry
from .plugins import build_plugin_manager, call_each
from .registry import ModelRegistry
from .scheduler import Scheduler
from .serving.pipeline import Pipeline
from .serving.scoring import Scoring
from .settings import Settings

log = logging.getLogger("millm")


class Host:
    """Everything a route or a plugin needs: settings, plugins, models, queue, database."""

    def __init__(self, settings: Settings, pm: pluggy.PluginManager) -> None:
        self.settings = settings
        self.pm = pm
        self.report = pm.millm_report  # type: ignore[attr-defined]
        self.fields = FieldRegistry()
        call_each(pm, "register_request_fields", register=self.fields.register)
        self.engines = self._collect_engines()
        self.scheduler = Scheduler(settings["MILLM_QUEUE_MAX"])
        self.registry = ModelRegistry(self, self.engines)
        self.db = Database(database_url(settings))
        self.pipeline = Pipeline(self)
        #: Serves scoring-mode requests: ``async (host, ctx) -> (body, headers)``.
        self.scoring = Scoring()
        #: Extra (path, pydantic model) request bodies for ``/openapi.json``.
        self.openapi_bodies: list = []
        self._load_task: asyncio.Task | None = None

    def _collect_engines(self) -> list[EngineSpec]:
        engines: dict[str, EngineSpec] = {}

        def register(spec: EngineSpec) -> None:
            if spec.name in engines:
                raise ValueError(f"engine {spec.name!r} is registered twice")
            engines[spec.name] = spec

        call_each(self.pm, "register_engines", register=register)
        return list(engines.values())

    def call_each(self, hook_name: str, **kwargs: Any) -> None:
        """Call a hook plugin by plugin; one plugin's failure is logged, not raised."""
        for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
            try:
                impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})
            except Exception:
                log.exception("plugin %s failed in %s", impl.plugin_name, hook_name)

    def listed_models(self) -> list[Any]:
        """What ``/v1/models`` lists: the registry's listing, narrowed by any plugin (e.g. a steering lock)."""
        entries = self.registry.listed()
        keep = {e.id for e in entries}
        for allowed in self.pm.hook.filter_listed_models(host=self, model_ids=[e.id for e in entries]):
            if allowed is not None:
                keep &= set(allowed)
        return [e for e in entries if e.id in keep]

    def migrations(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        call_each(self.pm, "register_migrations", register=lambda name, path: found.append((name, str(path))))
        return found

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Migrate the database, discover models and let plugins load their state."""
        self.db.upgrade(self.migrations())
        self.registry.discover()
        call_each(self.pm, "startup", host=self)

    async def load_start_model(self) -> None:
        entry = self.registry.start_model
        if entry is None or not self.settings["MILLM_LOAD_ON_START"]:
            return
        try:
            await self.registry.load(entry)
        except MillmError as exc:
            log.error("the start model %s failed to load: %s", entry.id, exc.message)

    def stop(self) -> None:
        self.call_each("shutdown", host=self)
        if self.registry.engine is not None:
            engine = self.registry.engine
            try:
                self.scheduler.run_sync(engine.close)
            except Exception:
                log.exception("closing the model failed")
        self.scheduler.shutdown()
        self.db.dispose()


class _Lifespan:
    """ASGI lifespan: start loading the start model without blocking the listener."""

    def __init__(self, host: Host) -> None:
        self.host = host

    async def process_startup(self, scope: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        self.host._load_task = asyncio.create_task(self.host.load_start_model())

    async def process_shutdown(self, scope: Mapping[str, Any], event: Mapping[str, Any]) -> None:
        task = self.host._load_task
        if task is not None and not task.done():
            task.cancel()
        await asyncio.to_thread(self.host.stop)


def build(settings: Settings | None = None, pm: pluggy.PluginManager | None = None) -> tuple[falcon.asgi.App, Host]:
    """The ASGI app and its host. Tests pass their own settings and plugin manager."""
    from . import routes

    settings = settings or Settings()
    pm = pm or build_plugin_manager(settings)
    host = Host(settings, pm)
    host.start()
    app = falcon.asgi.App(middleware=[_Lifespan(host)], cors_enable=False)
    app.req_options.strip_url_path_trailing_slash = True
    routes.install(app, host)
    return app, host


def create_app(settings: Settings | None = None, pm: pluggy.PluginManager | None = None) -> falcon.asgi.App:
    """The ASGI app (``gunicorn -k uvicorn_worker.UvicornWorker 'millm_host.app:create_app()'``)."""
    return build(settings, pm)[0]
