"""The GGUF engine as the server holds it: llama.cpp in a child process, restarted when it dies.

llama.cpp is native code: a SIGSEGV, a SIGILL (an AMX kernel on a CPU that
refuses it) or an abort would end the whole server. ``ProcessEngine`` keeps the
model in a child (``worker.py``) and everything else here: the vocabulary
(loaded alone, no weights), tokenizing, decoding and chat rendering, so the host
decodes without crossing the pipe. Generation and embeddings cross it.

When the child dies, the requests in flight fail with ``503 engine_crashed``
(with ``Retry-After``), a supervisor thread starts another child with the same
model, and the next request waits for it. ``status()`` (in ``/api/health``)
reports the restarts and the last signal.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from millm_host.api import (
    SERVER_ERROR,
    LayerHook,
    MillmError,
    ModelDescriptor,
    ModelInfo,
    ModelLoadFailed,
    ModelNotLoaded,
    SamplingParams,
    TokenIterator,
)

from . import wire
from .control import LayerVectors
from .loader import LoadOptions, load_vocabulary
from .text_engine import GGUFTextEngine

log = logging.getLogger("millm.gguf")

RUNNING, RESTARTING, FAILED, CLOSED = "running", "restarting", "failed", "closed"


class EngineCrashed(MillmError):
    """The engine process died under a request; it is being restarted with the same model."""

    status, code, type = 503, "engine_crashed", SERVER_ERROR


class _ChildGone(Exception):
    """The child's socket closed or broke: it died (or is dying)."""


class Child:
    """One worker process and the server's end of its socket."""

    #: How a worker is started; the socket's file descriptor number is appended.
    command: Sequence[str] = (sys.executable, "-P", "-m", "millm_engine_gguf.worker")

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [*self.command, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                env=_child_environment(),
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.pid = self.proc.pid

    def send(self, frame: bytes) -> None:
        try:
            self.conn.send_bytes(frame)
        except OSError as exc:
            raise _ChildGone() from exc

    def receive(self) -> bytes:
        try:
            return self.conn.recv_bytes()
        except (EOFError, OSError) as exc:
            raise _ChildGone() from exc

    def load(
        self, descriptor: ModelDescriptor, options: LoadOptions, progress: Callable[[str], None]
    ) -> tuple[ModelInfo, int]:
        """Have the child load the model; its info and embedding window. ``_ChildGone`` if it dies."""
        self.send(wire.pack(wire.LOAD, (descriptor, options)))
        while True:
            frame = self.receive()
            tag = frame[:1]
            if tag == wire.PROGRESS:
                progress(frame[1:].decode("utf-8", "replace"))
            elif tag == wire.LOADED:
                return wire.unpack(frame)
            elif tag == wire.ERROR:
                raise wire.frame_error(frame)
            else:
                raise RuntimeError(f"the gguf engine process sent {tag!r} while loading")

    def reap(self, timeout: float = 10.0) -> int:
        """Wait for the process to end (killing it after ``timeout``); its return code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def exit_text(self) -> str:
        code = self.proc.returncode
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by {signal_name(-code)}"
        return f"exited with code {code}"

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the child to close its model and leave; kill it if it does not within ``timeout``."""
        if self.proc.poll() is None:
            try:
                self.conn.send_bytes(wire.CLOSE)
            except OSError:
                pass
            self.reap(timeout)
        self.conn.close()


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _child_environment() -> dict[str, str]:
    """The server's environment, with its module path: the child imports what the server imports."""
    path = [entry or os.getcwd() for entry in sys.path]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


class ProcessEngine(GGUFTextEngine):
    """A GGUF model whose llama.cpp lives in a child process (see the module docstring)."""

    #: The text methods read the vocabulary loaded here, never the child: the host tokenizes on its
    #: text thread while a generation runs (one hop before the generation, not three).
    concurrent_text = True

    def __init__(
        self,
        descriptor: ModelDescriptor,
        options: LoadOptions,
        vocabulary: Any,
        child: Child,
        info: ModelInfo,
        embedding_window: int,
        load_seconds: float,
    ) -> None:
        super().__init__(vocabulary)
        self.info = info
        self._descriptor, self._options = descriptor, options
        self._embedding_window = embedding_window
        self._load_seconds = load_seconds
        self._child = child
        self._cond = threading.Condition()
        self._state = RUNNING
        self._restarts = 0
        self._last_exit: str | None = None
        self._last_signal: str | None = None
        self._last_error: str | None = None
        self._retry_after = 1.0
        self._closed = threading.Event()
        self._active: TokenStream | None = None  # the generation in progress
        self._unread: TokenStream | None = None  # a stopped generation whose END is still in the socket
        self._supervisor = threading.Thread(target=self._supervise, name="gguf-supervisor", daemon=True)
        self._supervisor.start()

    @classmethod
    def load(cls, descriptor: ModelDescriptor, settings: Any, progress: Callable[[str], None]) -> ProcessEngine:
        """Start a child that loads ``descriptor``; meanwhile load its vocabulary here (engine thread).

        With ``GGUF_PARALLEL`` > 1 the engine is a ``parallel.ParallelEngine``."""
        options = LoadOptions.from_settings(settings)
        started = time.monotonic()
        child = Child()
        vocabulary = None
        try:
            vocabulary = load_vocabulary(descriptor.path)
            try:
                info, window = child.load(descriptor, options, progress)
            except _ChildGone:
                child.reap()
                raise ModelLoadFailed(
                    f"loading model {descriptor.id!r} failed: the gguf engine process "
                    f"(pid {child.pid}) ended ({child.exit_text()}) while loading it"
                ) from None
            engine_class = cls
            if options.parallel > 1 and cls is ProcessEngine:
                from .parallel import ParallelEngine  # imports this module

                engine_class = ParallelEngine
            return engine_class(descriptor, options, vocabulary, child, info, window, time.monotonic() - started)
        except BaseException:
            child.stop(timeout=2)
            if vocabulary is not None:
                vocabulary.close()
            raise

    @property
    def embedding_window(self) -> int:
        return self._embedding_window

    def status(self) -> dict[str, Any]:
        """The child process, for ``/api/health``: state, pid, restarts, how the last one ended."""
        return {
            "process": "child",
            "state": self._state,
            "pid": self._child.pid,
            "restarts": self._restarts,
            "last_exit": self._last_exit,
            "last_signal": self._last_signal,
            "last_error": self._last_error,
            "generating": self._active is not None,
        }

    # --- compute ----------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        hooks: Sequence[LayerHook] = (),
        logits_processors: Sequence[Callable[[Sequence[int], Any], Any]] = (),
    ) -> TokenIterator:
        prompt, vectors = self.check_generation(prompt_ids, hooks, logits_processors)
        return TokenStream(self, prompt, params, vectors)

    def embed(self, ids: Sequence[int], pooling: str = "mean") -> list[float]:
        frame = self._request(wire.pack(wire.EMBED, (list(ids), pooling)), "embedding")
        if frame[:1] == wire.ERROR:
            raise wire.frame_error(frame)
        if frame[:1] != wire.VECTOR:
            self._child.proc.kill()  # out of step with us: a new child is the only safe state
            raise RuntimeError(f"the gguf engine process sent {frame[:1]!r} while embedding")
        return array("f", frame[1:]).tolist()

    def close(self) -> None:
        """Stop the child (its model closes there) and the supervisor."""
        if self._active is not None:
            self._active.close()
        with self._cond:
            if self._state == CLOSED:
                return
            self._state = CLOSED
            self._cond.notify_all()
        self._closed.set()
        self._child.stop()
        self._supervisor.join(30)
        self.close_text()

    # --- the child --------------------------------------------------------------------
    def _request(self, frame: bytes, doing: str) -> bytes:
        """Send ``frame`` and return the reply. A child found dead before it got the frame is waited for."""
        child = self._send_first(frame, doing)
        try:
            return child.receive()
        except _ChildGone:
            raise self._crashed(child, doing) from None

    def _send_first(self, frame: bytes, doing: str) -> Child:
        """Send a request's first frame, to the restarted child if the current one died idle."""
        if self._active is not None:
            self._active.close()  # one request at a time: an abandoned stream is stopped first
        if self._unread is not None:
            stream, self._unread = self._unread, None
            stream.drain()
        child = self._ready_child()
        try:
            child.send(frame)
        except _ChildGone:
            self._child_died(child)  # it died while idle: nothing of this request was lost
            child = self._ready_child()
            try:
                child.send(frame)
            except _ChildGone:
                raise self._crashed(child, doing) from None
        return child

    def _ready_child(self) -> Child:
        """The running child, once a restart in progress has finished."""
        with self._cond:
            while self._state == RESTARTING:
                self._cond.wait()
            if self._state == RUNNING:
                return self._child
            if self._state == CLOSED:
                raise ModelNotLoaded(f"model {self.info.id!r} was unloaded")
            raise EngineCrashed(
                f"the gguf engine process could not be restarted ({self._last_error}); it is retried",
                headers=self._retry_header(),
            )

    def _crashed(self, child: Child, doing: str) -> EngineCrashed:
        """The error for a request whose child died under it."""
        self._child_died(child)
        return EngineCrashed(
            f"the gguf engine process (pid {child.pid}) ended ({child.exit_text()}) while {doing}; "
            f"it is being restarted with model "
            f"{self.info.id!r}: retry the request",
            headers=self._retry_header(),
        )

    def _retry_header(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self._retry_after)))}

    def _child_died(self, child: Child) -> None:
        """Record ``child``'s end once (a request and the supervisor may both see it) and start a restart."""
        child.reap()
        with self._cond:
            if child is not self._child or self._state != RUNNING:
                return
            self._state = RESTARTING
            self._last_exit = child.exit_text()
            code = child.proc.returncode
            self._last_signal = signal_name(-code) if code is not None and code < 0 else None
            self._retry_after = self._load_seconds
            self._cond.notify_all()
        log.error(
            "the gguf engine process (pid %d) ended (%s); restarting it with model %s",
            child.pid,
            self._last_exit,
            self.info.id,
        )

    def _supervise(self) -> None:
        """Wait for each child to end; unless closing, start the next (retrying a failed start with backoff)."""
        try:
            while True:
                child = self._child
                child.proc.wait()
                if self._closed.is_set():
                    return
                self._child_died(child)
                delay = 1.0
                while not self._restart():
                    if self._closed.wait(delay):
                        return
                    delay = min(delay * 2, 60.0)
                if self._closed.is_set():
                    return
        except Exception as exc:  # never leave requests waiting on a supervisor that is gone
            log.exception("the gguf engine supervisor failed")
            self._set_failed(f"the supervisor failed: {type(exc).__name__}: {exc}")

    def _restart(self) -> bool:
        """One attempt at a new child with the same model. False: it failed (recorded)."""
        started = time.monotonic()
        child = None
        try:
            child = Child()
            child.load(self._descriptor, self._options, lambda message: log.info("%s: %s", self.info.id, message))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if child is not None:
                if isinstance(exc, _ChildGone):
                    child.reap()
                    error = f"the new process ended ({child.exit_text()}) while loading"
                child.stop(timeout=2)
            log.error("restarting the gguf engine process for %s failed: %s", self.info.id, error)
            self._set_failed(error)
            return False
        with self._cond:
            closed = self._state == CLOSED
            if not closed:
                self._child, self._state, self._last_error = child, RUNNING, None
                self._restarts += 1
                self._load_seconds = time.monotonic() - started
                self._cond.notify_all()
        if closed:
            child.stop()
            return True
        log.warning(
            "the gguf engine process for %s restarted (pid %d, restart %d)", self.info.id, child.pid, self._restarts
        )
        return True

    def _set_failed(self, error: str) -> None:
        with self._cond:
            if self._state != CLOSED:
                self._state, self._last_error = FAILED, error
            self._cond.notify_all()


class FrameStream:
    """Tokens of one generation read from the child's frames: what serial and parallel mode share.

    A subclass names its frame tags and supplies ``_next_frame`` (send what the
    flow needs, then read this generation's next frame; raise ``engine_crashed``
    when the child is gone) and ``_end``.
    """

    TOKEN, PAUSED, END, ERROR, CACHED = wire.TOKEN, wire.PAUSED, wire.END, wire.ERROR, wire.CACHED

    _child: Child | None
    _done: bool
    _paused: bool
    #: Prompt tokens the child found in its KV cache (``usage.prompt_tokens_details.cached_tokens``);
    #: None until it said.
    cached_tokens: int | None = None

    def __iter__(self) -> FrameStream:
        return self

    def __next__(self) -> int:
        if self._done:
            raise StopIteration
        frame = self._next_frame()
        tag = frame[:1]
        if tag == self.TOKEN:
            return wire.frame_token(frame)
        if tag == self.CACHED:  # before the first token
            self.cached_tokens = wire.frame_cached(frame)
            frame = self._next_frame()
            tag = frame[:1]
            if tag == self.TOKEN:
                return wire.frame_token(frame)
        if tag == self.PAUSED:  # the child waits for CONTINUE before computing on
            self._paused = True
            return wire.frame_token(frame)
        self._end()
        if tag == self.ERROR:
            raise wire.frame_error(frame)
        if tag != self.END:
            assert self._child is not None
            self._child.proc.kill()  # out of step with us: a new child is the only safe state
            raise RuntimeError(f"the gguf engine process sent {tag!r} while generating")
        raise StopIteration

    def _next_frame(self) -> bytes:
        raise NotImplementedError

    def _end(self) -> None:
        raise NotImplementedError


class TokenStream(FrameStream):
    """Tokens of one generation as they come from the child (see ``wire``'s flow)."""

    def __init__(self, engine: ProcessEngine, prompt: list[int], params: SamplingParams, vectors: LayerVectors) -> None:
        self._engine = engine
        self._request = wire.pack(wire.GENERATE, (prompt, params, vectors))
        self._child: Child | None = None
        self._running = False
        self._done = False
        self._paused = False

    def _next_frame(self) -> bytes:
        engine = self._engine
        if self._child is None:
            try:
                self._child = engine._send_first(self._request, "generating")
            except BaseException:
                self._done = True
                raise
            engine._active, self._running = self, True
        child = self._child
        try:
            if self._paused:
                self._paused = False
                child.send(wire.CONTINUE)
            return child.receive()
        except _ChildGone:
            self._end()
            raise engine._crashed(child, "generating") from None

    def close(self) -> None:
        """Stop the generation in the child, at its next token.

        Its last frames are read by the next request (``drain``), so a request
        ends without waiting for the child's answer.
        """
        if self._running:
            child = self._child
            assert child is not None
            try:
                child.send(wire.STOP)
                self._engine._unread = self
            except _ChildGone:
                self._engine._child_died(child)  # nothing left to fail: the request has its tokens
        self._end()

    def drain(self) -> None:
        """Read the frames the child sent after this stream was closed, up to its END."""
        child = self._child
        assert child is not None
        try:
            while child.receive()[:1] not in (wire.END, wire.ERROR):
                pass
        except _ChildGone:
            self._engine._child_died(child)

    def _end(self) -> None:
        self._running, self._done = False, True
        if self._engine._active is self:
            self._engine._active = None
