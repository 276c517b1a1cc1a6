"""The app in this process, for logic tests: no subprocess, no port, no torch.

``AppServer`` builds the app (``millm_host.app.build``) with its own settings, data
directory and plugin manager, and drives it through ``falcon.testing.ASGIConductor``
(lifespan included) on an event loop in a background thread. It offers what
``ServerProcess`` offers (``http()``, ``openai()``, ``model_id``, ``log()``), so a
test runs against either with the same code: the httpx and openai clients it
hands out send their requests through the conductor instead of a socket.

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
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
from falcon.testing import ASGIConductor

from . import databases, echo, extra_plugins

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


class ConductorTransport(httpx.BaseTransport):
    """An httpx transport that sends each request through the app's ASGI conductor.

    The response body streams: a chunk reaches the client as soon as the app sends
    it, and closing the response early disconnects the simulated client.
    """

    def __init__(self, server: AppServer) -> None:
        self.server = server

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        headers = [(name, value) for name, value in request.headers.multi_items() if name.lower() != "host"]
        result = self.server.call(
            self.server.conductor.simulate_request(
                # The path as sent (percent-encoded): falcon decodes it, as a server would.
                request.method,
                request.url.raw_path.split(b"?")[0].decode("ascii"),
                query_string=request.url.query.decode() or None,
                headers=headers,
                body=body,
                host=request.url.host,
                _stream_result=True,
            )
        )
        response_headers = [(k, v) for k, v in result.headers.items() if k.lower() != "content-length"]
        return httpx.Response(
            result.status_code, headers=response_headers, stream=_BodyStream(self.server, result), request=request
        )


class _BodyStream(httpx.SyncByteStream):
    """A streamed result's body, read on the app's loop as the app writes it."""

    POLL_S = 0.005

    def __init__(self, server: AppServer, result: Any) -> None:
        self.server, self.result = server, result
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        while True:
            chunk = self.server.call(self._next())
            if chunk is None:
                return
            yield chunk

    async def _next(self) -> bytes | None:
        """The next bytes the app sent; None once it finished."""
        while True:
            done = self.result._task.done()  # falcon's StreamedResult exposes no "finished" flag
            data = await self.result.stream.read()
            if data:
                return data
            if done:
                return None
            await asyncio.sleep(self.POLL_S)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.server.call(self.result.finalize())


class AppServer:
    """The app served in-process; ``start()`` returns once the start model is resident."""

    base_url = "http://localhost"  # a loopback name: the Host check (MILLM_ALLOWED_HOSTS) lets it in

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
    ) -> None:
        """``models`` maps echo model names to ``echo_model_dir`` options (default: one ``echo``);
        ``model`` is the start model, an id or a path (a tiny checkpoint directory with
        ``plugins=["engine_transformers"]`` serves it with the real engine, in-process);
        ``register`` adds plugin objects (modules, classes or instances with hookimpls) for this app only."""
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
        self._log = _LogLines()
        self.host: Any = None
        self.app: Any = None
        self.conductor: Any = None

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
        self.conductor = ASGIConductor(self.app)
        self.call(self.conductor.__aenter__(), timeout)
        self.call(self._loaded(), timeout)
        status = self.health()["status"]
        if self.wait_for is not None and status != self.wait_for:
            self.stop()
            raise RuntimeError(f"the in-process app is {status!r}, not {self.wait_for!r}:\n{self.log()}")
        return self

    async def _loaded(self) -> None:
        task = self.host._load_task
        if task is not None:
            await task

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = 120) -> T:
        """Run ``coro`` on the app's event loop and wait for its result."""
        assert self._loop is not None, "start() the app first"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def stop(self) -> None:
        """Run the lifespan shutdown (plugins' ``shutdown``, the model closed) and stop the loop."""
        if self._loop is None:
            return
        try:
            self.call(self.conductor.__aexit__(None, None, None), 60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            assert self._thread is not None
            self._thread.join(10)
            self._loop.close()
            self._loop = None
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

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    def http(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url, transport=ConductorTransport(self), timeout=kwargs.pop("timeout", 120), **kwargs
        )

    def openai(self, **kwargs: Any) -> Any:
        import openai

        # openai 3 types its client as httpx2's; httpx's works alike (and openai 1 and 2 want it).
        client: Any = httpx.Client(transport=ConductorTransport(self))
        return openai.OpenAI(base_url=self.v1, api_key="not-needed", max_retries=0, http_client=client, **kwargs)
