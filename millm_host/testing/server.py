"""A real ``millm serve`` process on 127.0.0.1, for black-box tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from . import databases, zygote
from .clients import LoopbackClients
from .extra_plugins import with_test_plugins


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shared_cache_dir() -> Path:
    """Shared across tests and runs: converted models, tokenizers, tiny models."""
    root = Path(os.environ.get("MILLM_TEST_CACHE", Path.home() / ".cache" / "millm-tests"))
    root.mkdir(parents=True, exist_ok=True)
    return root


class ServerProcess(LoopbackClients):
    """``millm serve`` in a subprocess; ``start()`` waits until the model is loaded.

    ``launch()`` then ``ready()`` is ``start()`` in two steps, so that several servers start at once.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        model: str | None = None,
        env: Mapping[str, str] | None = None,
        args: list[str] | None = None,
        python: str | None = None,
        wait_for: str | None = "ok",
    ) -> None:
        self.port = free_port()
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"server-{self.port}.log"
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.wait_for = wait_for
        cmd = [
            python or sys.executable,
            "-m",
            "millm_host.cli",
            "serve",
            "--port",
            str(self.port),
            "--log-level",
            "info",
        ]
        if model:
            cmd += ["--model", str(model)]
        self.cmd = cmd + list(args or [])
        self.env = with_test_plugins(
            {
                **os.environ,
                "MILLM_DATA_DIR": str(self.data_dir),
                **databases.database_environ(self.data_dir),
                "MILLM_CACHE_DIR": str(shared_cache_dir() / "model-cache"),
                "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false",
                **(env or {}),
            }
        )
        self.proc: subprocess.Popen | zygote.ForkedProcess | None = None

    def start(self, timeout: float = 300) -> ServerProcess:
        return self.launch().ready(timeout)

    def launch(self) -> ServerProcess:
        """Start the process; ``ready()`` waits for it."""
        self._log = open(self.log_path, "wb")
        self.proc = zygote.popen(self.cmd, self.env, self._log)
        return self

    def ready(self, timeout: float = 300) -> ServerProcess:
        """Wait until the launched process answers ``/api/health`` with the status it waits for."""
        assert self.proc is not None, "launch() the server first"
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"millm serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                health = httpx.get(f"{self.base_url}/api/health", timeout=2).json()
                last = health
                if self.wait_for is None or health["status"] == self.wait_for:
                    return self
                if health["status"] == "failed":
                    raise RuntimeError(f"model failed to load:\n{self.log()}")
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)  # a forked server is ready in about a second: 0.2 s steps lost a tenth of it
        self.stop()
        raise TimeoutError(f"server not ready after {timeout} s (last health {last}):\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()

    def restart(self, timeout: float = 300) -> ServerProcess:
        """Stop and start again on the same port and data directory."""
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def model_id(self) -> str:
        """The id of the resident model (``/v1/models`` also lists the others on disk)."""
        return httpx.get(f"{self.base_url}/api/health", timeout=10).json()["model"]
