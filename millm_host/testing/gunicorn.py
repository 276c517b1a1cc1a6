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


def wait_ready(base: str, in_a_row: int = 8, attempts: int = 1200) -> str:
    """Every worker ready (``in_a_row`` new connections in a row answer 200); the model's id."""
    ready, model = 0, None
    for _ in range(attempts):
        try:
            answer = httpx.get(f"{base}/api/health/ready", timeout=2)
        except httpx.HTTPError:
            answer = None
        if answer is not None and answer.status_code == 200:
            ready, model = ready + 1, answer.json()["model"]
            if ready == in_a_row:
                return model
        else:
            ready = 0
            time.sleep(0.1)
    raise AssertionError("the workers never became ready")


def until_every_worker(base: str, count: int, ok: Callable[[dict[str, Any]], bool], timeout: float = 60) -> None:
    """Wait until ``count`` workers, told apart by their replica id, have each answered an ``/api/health``
    that ``ok`` accepts. Eight new connections at once, so the kernel spreads them over the workers: one at
    a time, one idle worker may take every connection while the other has not caught up."""

    def health(_: int) -> dict[str, Any]:
        return httpx.get(f"{base}/api/health", timeout=10).json()

    good: set[str] = set()
    deadline = time.monotonic() + timeout
    with ThreadPoolExecutor(8) as pool:
        while len(good) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(good)} of {count} workers got there in {timeout:g} s")
            good |= {report["replica"]["id"] for report in pool.map(health, range(8)) if ok(report)}
            time.sleep(0.1)


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
        wait_ready(base)
        yield base
    finally:
        stop(proc, log)
