"""The app in this process, for logic tests: no subprocess, no torch.

``AppServer`` builds the app (``millm_host.app.build``) with its own settings, data
directory and plugin manager, and serves it with uvicorn on an event loop in a
background thread, on a socket bound to 127.0.0.1 (lifespan included). It offers what
``ServerProcess`` offers (``http()``, ``openai()``, ``model_id``, ``log()``), so a test
runs against either with the same code, and both send real HTTP over loopback.

Real sockets, not an ASGI conductor: falcon's ``ASGIConductor`` waits for a streamed
response's start with ``while not status: await asyncio.sleep(0)``, so each request in
flight spun the app's event loop, and a few concurrent ones held the GIL from the
engine's thread until they timed out. A socket read blocks without the GIL.

By default it serves the echo engine (``millm_host.testing.echo``) from a models
directory of its own, with no installed plugin: ``plugins=["detector_example"]``
loads those installed plugins (an allow-list, ``MILLM_PLUGINS``), ``plugins="all"``
every installed one. Real-server
tests (``ServerProcess``) remain for what a user walks end to end: real models,
disconnects, gunicorn.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Coroutine, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from . import databases, echo, extra_plugins
from .clients import LoopbackClients

T = TypeVar("T")

ECHO_MODEL = "echo"


class _LogLines(logging.Handler):
    """Collects formatted ``millm`` log lines (every in-process app shares the loggers)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class AppServer(LoopbackClients):
    """The app served in-process; ``start()`` returns once the start model is resident."""

    base_url = ""  # http://127.0.0.1:<port> once started

    def __init__(
        self,
        data_dir: Path,
        *,
        env: Mapping[str, str] | None = None,
        plugins: Iterable[str] | str = (),
        models: Mapping[str, Mapping[str, Any]] | None = None,
        model: str | None = ECHO_MODEL,
        wait_for: str | None = "ok",
        register: Iterable[object] = (),
        checkpoint: Path | None = None,
    ) -> None:
        """``models`` maps echo model names to ``echo_model_dir`` options (default: one ``echo``);
        ``model`` is the start model, an id or a path; ``checkpoint``, a model directory, serves it
        instead of any echo model (a tiny checkpoint with ``plugins=["engine_transformers"]`` or
        ``"all"``: the real engine, in-process);
        ``register`` adds plugin objects (modules, classes or instances with hookimpls) for this app only."""
        if checkpoint is not None:
            models, model = {}, str(checkpoint)
        self.data_dir = Path(data_dir)
        self.models_dir = self.data_dir / "models"
        self.models_dir.mkdir(parents=True, exist_ok=True)
        echo_models = {ECHO_MODEL: {}} if models is None else models
        for name, options in echo_models.items():
            echo.echo_model_dir(self.models_dir / name, **options)
        self.all_plugins = plugins == "all"
        self.plugins = [] if isinstance(plugins, str) else list(plugins)
        self.environ = {
            "MILLM_DATA_DIR": str(self.data_dir),
            "MILLM_MODELS_DIR": str(self.models_dir),
            # Echo models go to the echo engine before any installed engine that reads config.json.
            **({"MILLM_ENGINE": echo.ENGINE_NAME} if echo_models else {}),
            **({"MILLM_MODEL": model} if model else {}),
            **({"MILLM_PLUGINS": ",".join(self.plugins)} if self.plugins else {}),
            # The test-only plugins (tests/plugins) are not installed: named here, as ServerProcess names them.
            **(extra_plugins.in_process_environ() if self.all_plugins or self.plugins else {}),
            # SQLite in the data directory, or a PostgreSQL database of its own (MILLM_TEST_DATABASE)
            **databases.database_environ(self.data_dir),
            **(env or {}),
        }
        self.wait_for = wait_for
        self.extra_plugins = list(register)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: Any = None  # uvicorn.Server
        self._serving: Any = None  # the Future of its serve()
        self._log = _LogLines()
        self.host: Any = None
        self.app: Any = None

    # --- lifecycle ------------------------------------------------------------------
    def start(self, timeout: float = 60) -> AppServer:
        from ..app import build
        from ..plugins import build_plugin_manager, collect_engines
        from ..settings import Settings

        settings = Settings(environ=self.environ)
        pm = build_plugin_manager(settings, load_entry_points=self.all_plugins or bool(self.plugins))
        pm.register(echo, name="millm_echo")
        for plugin in self.extra_plugins:
            pm.register(plugin)
        pm.check_pending()
        pm.millm_engines = collect_engines(pm, settings)  # type: ignore[attr-defined]  # the echo engine and any engine registered here
        logging.getLogger("millm").addHandler(self._log)
        self.app, self.host = build(settings, pm)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="millm-test-loop", daemon=True)
        self._thread.start()
        try:
            self._serve(settings, timeout)
            self.call(self._loaded(), timeout)
        except BaseException:
            self.stop()
            raise
        status = self.health()["status"]
        if self.wait_for is not None and status != self.wait_for:
            self.stop()
            raise RuntimeError(f"the in-process app is {status!r}, not {self.wait_for!r}:\n{self.log()}")
        return self

    def _serve(self, settings: Any, timeout: float) -> None:
        """Start uvicorn on the loop, on a socket bound to a free loopback port; wait for its lifespan startup."""
        import uvicorn

        from ..cli import _bind

        sock = _bind("127.0.0.1", 0)  # as ``millm serve`` listens: TCP_NODELAY, or each reply waits ~40 ms
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(
            self.app,
            lifespan="on",
            log_config=None,  # the test's logging stays as pytest set it
            access_log=False,
            # As ``millm serve``: uvicorn cancels what still runs a little after the host's own grace.
            timeout_graceful_shutdown=settings["MILLM_SHUTDOWN_GRACE_S"] + 5,
        )
        self._server = uvicorn.Server(config)
        assert self._loop is not None
        self._serving = asyncio.run_coroutine_threadsafe(self._server.serve(sockets=[sock]), self._loop)
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if self._serving.done():
                self._serving.result()  # raises what failed, if anything did
                raise RuntimeError(f"the in-process app did not start:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the in-process app did not start in {timeout} s:\n{self.log()}")
            time.sleep(0.01)

    async def _loaded(self) -> None:
        task = self.host._load_task
        if task is not None:
            await task

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 120) -> T:
        """Run ``coro`` on the app's event loop and wait for its result."""
        assert self._loop is not None, "start() the app first"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        """Stop uvicorn (the lifespan shutdown: plugins' ``shutdown``, the model closed) and the loop."""
        if self._loop is None:
            return
        try:
            if self._serving is not None:
                self.host.begin_shutdown()  # as SIGTERM does to ``millm serve``
                self._server.should_exit = True
                self._serving.result(self._server.config.timeout_graceful_shutdown + 30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            assert self._thread is not None
            self._thread.join(10)
            self._loop.close()
            self._loop = None
            self._serving = None
            logging.getLogger("millm").removeHandler(self._log)

    def __enter__(self) -> AppServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what ServerProcess offers --------------------------------------------------
    def log(self) -> str:
        """The ``millm`` log lines written while this app ran (what the loggers' levels let through)."""
        return "\n".join(self._log.lines)

    def health(self) -> dict[str, Any]:
        with self.http() as http:
            return http.get("/api/health").json()

    @property
    def model_id(self) -> str:
        """The id of the resident model."""
        return self.health()["model"]
