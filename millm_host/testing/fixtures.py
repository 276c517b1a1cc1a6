"""pytest fixtures shared by the host's and every plugin's tests.

Enabled by the repository's root ``conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from . import databases, zygote
from .inprocess import AppServer
from .server import ServerProcess


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--database",
        choices=("sqlite", "postgresql"),
        default=None,
        help="the database every test app gets (default: $MILLM_TEST_DATABASE, else sqlite); "
        "postgresql needs $MILLM_TEST_POSTGRES_URL (scripts/postgres-dev.sh)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "storage: writes to the database; CI runs these on PostgreSQL too")
    config.addinivalue_line(
        "markers", "e2e: talks to a real process (millm serve, gunicorn, a tool); set at collection"
    )
    chosen = config.getoption("--database", default=None)
    if chosen:
        os.environ[databases.BACKEND] = chosen
    try:
        databases.backend()  # a bad value or a missing URL fails now, not in the first app
    except (ValueError, RuntimeError) as exc:
        raise pytest.UsageError(str(exc)) from None


#: Fixtures that start ``millm serve`` processes: a test using one, directly or through another fixture, is ``e2e``.
SERVER_FIXTURES = frozenset({"server_factory", "replicas_factory", "tiny_server", "default_server"})
#: What in a test module's source starts a process itself (a server, gunicorn, a tool).
PROCESS_STARTERS = ("ServerProcess(", "GunicornServer(", "subprocess.")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``e2e`` every test that talks to a real process (its start-up, signals, real clients):
    ``pytest -m "not e2e"`` is the fast, in-process layer of the pyramid."""
    starts: dict[str, bool] = {}
    for item in items:
        path = str(getattr(item, "path", ""))
        if path not in starts:
            try:
                source = Path(path).read_text(encoding="utf-8")
            except OSError:
                source = ""
            starts[path] = any(starter in source for starter in PROCESS_STARTERS)
        if starts[path] or SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


def pytest_report_header(config: pytest.Config) -> str:
    return f"database: {databases.backend()}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if zygote.launches:
        how = ", ".join(f"{count} {way}" for way, count in sorted(zygote.launches.items()))
        terminalreporter.write_line(f"test processes (millm serve): {how} (millm_host/testing/zygote.py)")


def pytest_sessionfinish(session: pytest.Session) -> None:
    databases.drop_made()
    zygote.stop()


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL database, dropped afterwards (skipped without PostgreSQL)."""
    if databases.postgres_url() is None:
        pytest.skip(databases.NO_POSTGRES)
    url = databases.create_database()
    yield url
    databases.drop_database(url)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A random 2-layer Llama with SmolLM2's tokenizer and chat template (float32)."""
    from .tiny_models import tiny_llama

    return tiny_llama()


#: Servers and apps started during the current test module (not ``shared=True``): stopped when it ends.
_module_started: list[ServerProcess | AppServer] = []


@pytest.fixture(scope="module", autouse=True)
def _stop_what_the_module_started() -> Iterator[None]:
    """Stop the module's servers and apps when the module ends, after its own fixtures' teardown.

    Kept to the end of the session, every module's servers (a process of about 450 MB each)
    and in-process apps added up until the kernel's OOM killer ended the test run. Session
    fixtures that share one server across modules start it with ``shared=True``.
    """
    first = len(_module_started)
    yield
    mine = _module_started[first:]
    del _module_started[first:]
    for server in reversed(mine):
        server.stop()


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ServerProcess]]:
    """Start ``millm serve`` processes; all are stopped at the end of the session.

    ``server_factory(model=path, env={...}, args=[...])`` returns a started server
    with its own data directory (a fresh SQLite database). With ``wait=False`` it
    returns as soon as the process is launched, so that several start at once (on
    two cores, two start in little more time than one): call ``server.ready()``
    before using it.
    """
    started: list[ServerProcess] = []

    def start(
        model: str | Path | None = None,
        *,
        env: dict[str, str] | None = None,
        args: list[str] | None = None,
        data_dir: Path | None = None,
        timeout: float = 300,
        wait_for: str | None = "ok",
        shared: bool = False,
        wait: bool = True,
    ) -> ServerProcess:
        server = ServerProcess(
            data_dir or tmp_path_factory.mktemp("millm-data"),
            model=str(model) if model else None,
            env=env,
            args=args,
            wait_for=wait_for,
        )
        started.append(server)
        if not shared:
            _module_started.append(server)
        server.launch()
        return server.ready(timeout) if wait else server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def replicas_factory(server_factory) -> Callable[..., list[ServerProcess]]:
    """``replicas_factory(count, model, env={...})``: ``count`` servers alike, started at once.

    Takes ``server_factory``'s arguments; with a shared ``MILLM_DATABASE_URL`` they are replicas.
    """

    def start(
        count: int, model: str | Path | None = None, *, timeout: float = 300, **kwargs: Any
    ) -> list[ServerProcess]:
        launched = [server_factory(model, wait=False, **kwargs) for _ in range(count)]
        return [server.ready(timeout) for server in launched]

    return start


@pytest.fixture(scope="session")
def tiny_server(server_factory, tiny_model_dir) -> ServerProcess:
    """A shared server on the tiny model. Tests must not change its state."""
    return server_factory(tiny_model_dir, shared=True)


@pytest.fixture(scope="session")
def default_server(server_factory) -> ServerProcess:
    """A shared server on the real default model (SmolLM2-135M-Instruct, transformers)."""
    return server_factory(shared=True)


@pytest.fixture(scope="session")
def app_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., AppServer]]:
    """Start in-process apps (``AppServer``) on the echo engine; all are stopped at the end of the session.

    ``app_factory(env={...}, plugins=[...], models={...})`` (or ``checkpoint=<model dir>``) returns a started app
    with its own data directory; see ``AppServer`` for the arguments.
    """
    started: list[AppServer] = []

    def start(*, shared: bool = False, **kwargs: Any) -> AppServer:
        app = AppServer(tmp_path_factory.mktemp("millm-app"), **kwargs)
        started.append(app)
        if not shared:
            _module_started.append(app)
        return app.start()

    yield start
    for app in started:
        app.stop()


@pytest.fixture(scope="session")
def echo_app(app_factory) -> AppServer:
    """A shared in-process app on the echo engine, no installed plugin. Tests must not change its state."""
    return app_factory(shared=True)


@pytest.fixture(scope="session")
def offline_tiktoken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real ``tiktoken`` module, its ``cl100k_base`` and ``o200k_base`` loading offline (``tiktoken_offline``)."""
    tiktoken = pytest.importorskip("tiktoken")
    from .tiktoken_offline import tiktoken_cache

    with tiktoken_cache(tmp_path_factory.mktemp("tiktoken-cache")):
        yield tiktoken
