"""Test servers forked from a process that has already imported torch and transformers.

Every ``millm serve`` a test starts spends about two seconds importing torch and transformers
before it reads a byte of its model, and the suite starts about seventy of them. The zygote
is one process per test session that imports those libraries once, then forks a child per
server: the child takes the server's environment, working directory and log file, and runs
``python -m millm_host.cli`` as a new interpreter would (``runpy``, its own session, exit code
reported back). Nothing of millm is imported before the fork, so every millm module, plugin
and setting is read fresh in the child.

Only third-party libraries are pre-imported, and some read environment variables as they are
imported (``HF_HOME``, ``OMP_NUM_THREADS``): those would keep the zygote's values in the child.
So the zygote records every variable its imports read through ``os.environ``, and a launch is
forked only when none of those differs from the zygote's environment, nor any that native code
or the interpreter's start reads (``NATIVE_PREFIXES``, ``STARTUP_*``); any other launch, or one
of another interpreter, is exec'd as before. ``MILLM_TEST_ZYGOTE=0`` turns the zygote off.

The wire: the test connects to the zygote's UNIX socket, sends one JSON line (argv, env, cwd)
with the log file's descriptor beside it (``SCM_RIGHTS``), and reads ``{"pid": n}``, later
``{"returncode": n}`` when the zygote has reaped the child. ``ForkedProcess`` wraps that
connection in the part of ``subprocess.Popen`` the tests use.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Imported before the first fork: the libraries whose import dominates a server's start.
PRELOAD = (
    "numpy",
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",
    "transformers.masking_utils",
    "transformers.modeling_layers",
    "transformers.modeling_gguf_pytorch_utils",
    "safetensors.torch",
    "tokenizers",
    "gguf",
    "llguidance",
    "sqlalchemy",
    "alembic",
    "falcon",
    "uvicorn",
    "pydantic",
    "httpx",
    "jsonschema",
)

#: Prefixes of variables that native libraries (OpenMP, BLAS, torch, the allocator) may read with getenv
#: as they load, out of the recording's sight, and of the libraries pre-imported here.
NATIVE_PREFIXES = (
    "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "TORCH", "PYTORCH_", "CUDA", "LD_", "MALLOC_", "GGML_", "LLAMA_",
    "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "SAFETENSORS_",
)  # fmt: skip
#: Read as the interpreter starts: its flags, the locale, the user's site-packages.
STARTUP_KEYS = frozenset({"HOME", "LANG", "LANGUAGE"})
STARTUP_PREFIXES = ("LC_", "PYTHON")
#: Read later in the child, as a new interpreter would read them.
RUN_TIME_KEYS = frozenset({"PYTHONPATH", "PYTHONUNBUFFERED", "TOKENIZERS_PARALLELISM"})


def blocking(env: Mapping[str, str], base: Mapping[str, str], imports_read: frozenset[str]) -> set[str]:
    """The variables that keep a launch with ``env`` from forking off a zygote whose environment is
    ``base`` and whose imports read ``imports_read``: those that differ and were read before the fork."""
    changed = {key for key in env.keys() | base.keys() if env.get(key) != base.get(key)} - RUN_TIME_KEYS
    return {
        key
        for key in changed
        if key in imports_read or key in STARTUP_KEYS or key.startswith(NATIVE_PREFIXES + STARTUP_PREFIXES)
    }


class _RecordingEnviron(os._Environ):
    """``os.environ`` while the zygote imports: it notes each variable read (all of them on iteration)."""

    read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)

    def __iter__(self) -> Any:
        self.read.update(super().__iter__())
        return super().__iter__()


def _preload() -> set[str]:
    """Import ``PRELOAD``; the variables those imports read."""
    plain = os.environ.__class__
    os.environ.__class__ = _RecordingEnviron
    try:
        for name in PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    finally:
        os.environ.__class__ = plain
    return _RecordingEnviron.read


# --- the zygote process ---------------------------------------------------------------------------------


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], int]:
    conn.settimeout(30)
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, more_fds, _, _ = socket.recv_fds(conn, 1 << 20, 1)
        if not chunk:
            raise ConnectionError("the launcher left before its request was whole")
        data += chunk
        fds += more_fds
    conn.settimeout(None)
    return json.loads(data), fds[0]


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()


def _zygote(path: str) -> tuple[dict[str, Any], int] | None:
    """Serve launches until stdin closes (the test session ended); in a forked child, return its request."""
    imports_read = _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wake-up byte is written
    children: dict[int, socket.socket] = {}
    sys.stdout.write(json.dumps({"imports_read": sorted(imports_read)}) + "\n")
    sys.stdout.flush()
    while True:
        readable, _, _ = select.select([listener, wake_r, sys.stdin], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            _reap(children)
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 4096):
            return None  # the test session is gone
        if listener not in readable:
            continue
        conn, _ = listener.accept()
        try:
            request, log_fd = _read_request(conn)
        except (OSError, ValueError):
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (wake_r, wake_w):
                os.close(fd)
            listener.close()
            conn.close()
            for child_conn in children.values():
                child_conn.close()
            return request, log_fd
        os.close(log_fd)
        children[pid] = conn
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _reap(children)  # one that ended before it was listed


def _become(request: dict[str, Any], log_fd: int) -> None:
    """In the forked child: take the launch's session, files and environment, then run its module."""
    import io
    import random
    import runpy

    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # what ``-m`` puts first, where the zygote's script put its own folder
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = paths  # where the interpreter puts PYTHONPATH: after the script's directory
    # As a new interpreter with PYTHONUNBUFFERED would: nothing waits in a buffer when the child is killed.
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True))
    sys.stdin = open(0, encoding=sys.stdin.encoding, errors=sys.stdin.errors, closefd=False)
    random.seed()  # not the zygote's sequence in every child
    argv = request["argv"]
    assert argv[1] == "-m", argv
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


def main() -> None:
    job = _zygote(sys.argv[1])
    if job is not None:
        _become(*job)  # the interpreter then exits as the server's would: atexit, finalizers, exit code


# --- the test side -------------------------------------------------------------------------------------


class ForkedProcess:
    """What the tests use of ``subprocess.Popen``, for a child of the zygote."""

    def __init__(self, conn: socket.socket, args: list[str]) -> None:
        self._conn, self.args = conn, args
        self._buffer = b""
        self._orphaned = False  # the zygote went away: the pid is watched instead
        self.returncode: int | None = None
        started = self._message(None)
        if started is None:
            raise RuntimeError("the test zygote went away before it forked")
        self.pid: int = started["pid"]

    def _message(self, timeout: float | None) -> dict[str, Any] | None:
        """The zygote's next message (``TimeoutExpired`` after ``timeout``; 0 looks); None once it is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            self._conn.settimeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
            try:
                chunk = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):  # settimeout(0) makes the socket non-blocking
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0) from None
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _exit_status(self, timeout: float | None) -> int:
        """Wait up to ``timeout`` for the child to end (``TimeoutExpired`` if it has not)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._orphaned:
            message = self._message(timeout)
            if message is not None:
                return message["returncode"]
            self._orphaned = True
        while _running(self.pid):  # no parent to tell its status: wait until it is gone
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.05)
        return -signal.SIGKILL  # not known

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._ended(self._exit_status(0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._ended(self._exit_status(timeout))
        assert self.returncode is not None
        return self.returncode

    def _ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._conn.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no longer does: an orphan's new parent may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Zygote:
    """A zygote process for launches in ``env``'s image (``blocked`` says which are not)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self._dir = tempfile.mkdtemp(prefix="millm-zygote-")
        self.path = os.path.join(self._dir, "socket")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.path],  # by path: ``-m`` would import millm_host first
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready:
            raise RuntimeError(f"the test zygote did not start (exit {self.proc.wait()})")
        self.imports_read = frozenset(json.loads(ready)["imports_read"])

    def blocked(self, env: Mapping[str, str]) -> set[str]:
        """What keeps a launch with ``env`` from forking here (nothing: it may)."""
        return blocking(env, self.env, self.imports_read)

    def launch(self, argv: list[str], env: Mapping[str, str], log_fd: int) -> ForkedProcess:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        request = json.dumps({"argv": argv, "env": dict(env), "cwd": os.getcwd()}).encode() + b"\n"
        socket.send_fds(conn, [request], [log_fd])
        return ForkedProcess(conn, argv)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # its children, the servers, are the fixtures' to stop
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self._dir)


#: This process's zygotes. A library the tests import may set a variable as it is imported
#: (``KMP_DUPLICATE_LIB_OK``), and every later launch inherits it: a zygote is started for the
#: environment as it is then, up to ``MAX_ZYGOTES`` in a session.
_zygotes: list[Zygote] = []
MAX_ZYGOTES = 4
#: How this process's launches started: ``forked``, or ``exec'd`` (and what kept them from forking).
launches: collections.Counter[str] = collections.Counter()


def _environment_now() -> dict[str, str]:
    """This process's environment without what changes from test to test. An import that lists the
    environment (tqdm's) reads every variable there, and a launch that changed one would not fork."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("MILLM_", "PYTEST_"))}


def _zygote_for(env: Mapping[str, str]) -> Zygote | set[str]:
    """A running zygote a launch with ``env`` may fork from (started if the environment moved),
    or the variables that keep it from forking."""
    running = [z for z in _zygotes if z.proc.poll() is None]
    for candidate in running:
        if not candidate.blocked(env):
            return candidate
    now = _environment_now()
    if len(_zygotes) < MAX_ZYGOTES and all(z.blocked(now) for z in running):
        try:
            started = Zygote(now)
        except (OSError, RuntimeError, ValueError) as exc:  # the launch is exec'd instead, as before
            warnings.warn(f"the test zygote did not start: {exc}", stacklevel=2)
            return {"(no zygote: it did not start)"}
        _zygotes.append(started)
        atexit.register(started.stop)
        running.append(started)
        if not started.blocked(env):
            return started
    return min((z.blocked(env) for z in running), key=len, default={"(no zygote)"})


def popen(argv: list[str], env: Mapping[str, str], log: Any) -> subprocess.Popen | ForkedProcess:
    """``argv`` (``python -m module ...``) with ``env``, its output to ``log``, in a session of its own:
    forked from a zygote where that is the same as exec'ing it, else exec'd."""
    if os.environ.get("MILLM_TEST_ZYGOTE", "1") != "0" and argv[0] == sys.executable and argv[1] == "-m":
        found = _zygote_for(env)
        if isinstance(found, Zygote):
            launches["forked"] += 1
            return found.launch(argv, env, log.fileno())
        launches[f"exec'd for {' '.join(sorted(found))}"] += 1
    else:
        launches["exec'd"] += 1
    return subprocess.Popen(argv, env=dict(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop() -> None:
    """Stop this process's zygotes (the session's end); the next launch starts another."""
    while _zygotes:
        _zygotes.pop().stop()


if __name__ == "__main__":
    main()
