"""gunicorn with uvicorn workers, as production runs it, for tests that need several worker processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from . import free_port, shared_cache_dir


def gunicorn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``gunicorn ARGS`` in a session of its own, its output in ``log`` (a pipe nobody reads could fill up
    and block the workers' logging), where ``stop`` can show it. Its control socket is beside the log:
    gunicorn's default (``~/.gunicorn/gunicorn.ctl``) is one per user, and each master unlinks it at start
    and stop, whoever made it."""
    cmd = [sys.executable, "-m", "gunicorn", "--control-socket", str(log.with_suffix(".ctl")), *args]
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen, log: Path) -> None:
    """SIGTERM to gunicorn and its workers; their log in the failure if they are not gone within 30 s (CI
    failed that way once, with nothing to read: the output went to an unread pipe)."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError("gunicorn did not stop within 30 s of SIGTERM:\n" + log.read_text()[-4000:]) from None


def until_every_worker(
    base: str, count: int, accepted: Callable[[httpx.Response], str | None], path: str, timeout: float = 300
) -> dict[str, Any]:
    """Ask ``path`` until ``count`` workers have each given a reply that ``accepted`` takes (it returns the
    reply's replica id, or None); those replies' bodies by replica id.

    Eight new connections at once, so the kernel spreads them over the workers: asked one at a time, one
    idle worker may take every connection while the other is still loading or has not caught up."""

    def ask(_: int) -> tuple[str, Any] | None:
        try:
            reply = httpx.get(base + path, timeout=10)
        except httpx.HTTPError:  # gunicorn is not listening yet
            return None
        replica = accepted(reply)
        return None if replica is None else (replica, reply.json())

    good: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(8) as pool:
        while len(good) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(good)} of {count} workers answered {path} as wanted in {timeout:g} s")
            good |= dict(found for found in pool.map(ask, range(8)) if found is not None)
            time.sleep(0.1)
    return good


def wait_ready(base: str, count: int) -> str:
    """Every one of ``count`` workers ready (``/api/health/ready`` answered 200); the model's id."""
    ready = until_every_worker(
        base, count, lambda reply: reply.json()["replica"] if reply.status_code == 200 else None, "/api/health/ready"
    )
    return next(iter(ready.values()))["model"]


@contextmanager
def workers(model_dir: Path, data_dir: Path, count: int = 2, env: dict[str, str] | None = None) -> Iterator[str]:
    """``count`` uvicorn workers under gunicorn serving ``model_dir`` on one database in ``data_dir``
    (the schema made first: workers starting at once would both migrate a fresh SQLite file); the base URL
    once every worker is ready."""
    port = free_port()
    full = {
        **os.environ,
        "MILLM_DATA_DIR": str(data_dir),
        "MILLM_MODEL": str(model_dir),
        "MILLM_CACHE_DIR": str(shared_cache_dir() / "model-cache"),
        **(env or {}),
    }
    subprocess.run([sys.executable, "-m", "millm_host.cli", "db", "upgrade"], env=full, check=True, capture_output=True)
    args = [
        "-k",
        "uvicorn_worker.UvicornWorker",
        "-w",
        str(count),
        "-b",
        f"127.0.0.1:{port}",
        "millm_host.app:create_app()",
    ]
    log = data_dir / "gunicorn.log"
    proc = gunicorn(args, full, log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, count)
        yield base
    finally:
        stop(proc, log)
