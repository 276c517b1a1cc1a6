"""The GGUF engine's child process: one llama.cpp model, driven over a socket by ``ProcessEngine``.

Started as ``python -m millm_engine_gguf.worker FD``. A native crash here
(SIGSEGV, SIGILL, an abort in llama.cpp) ends only this process: the server
fails the requests in flight and starts another. Its life is the server's: it
ignores the terminal's and the service manager's SIGINT/SIGTERM (the server
closes it), and leaves by itself when the socket closes or its parent process
changes (checked twice a second, even mid-computation), so it is never orphaned.
"""

from __future__ import annotations

import faulthandler
import json
import os
import select
import signal
import sys
import threading
import time
from array import array
from collections import deque
from collections.abc import Generator
from multiprocessing.connection import Connection
from typing import Any

from . import wire
from .batch import BatchContext, serial_reason
from .cpu import amx_flags, llama_system_info
from .engine import GGUFEngine


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    conn = Connection(int(args[0]))
    faulthandler.enable()  # a native crash prints the Python stack to the server's log, then dies as before
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _leave_with_parent(os.getppid())
    try:
        frame = conn.recv_bytes()
    except EOFError:
        return 0
    descriptor, options = wire.unpack(frame)

    def progress(message: str) -> None:
        conn.send_bytes(wire.PROGRESS + message.encode("utf-8"))

    try:
        progress(
            f"llama.cpp in process {os.getpid()}: {llama_system_info()}; "
            f"CPU reports AMX: {' '.join(amx_flags()) or 'no'}"
        )
        engine = GGUFEngine.load_with(descriptor, options, progress)
    except Exception as exc:
        conn.send_bytes(wire.error_frame(exc))
        return 1
    try:
        conn.send_bytes(wire.pack(wire.LOADED, (engine.info, engine.embedding_window)))
        if options.parallel > 1:
            ParallelWorker(conn, engine, options).serve()
        else:
            Worker(conn, engine, options.profile).serve()
    except (EOFError, OSError):
        pass  # the server went away
    finally:
        engine.close()
    return 0


def _leave_with_parent(parent: int) -> None:
    """Exit as soon as the parent is gone (a thread: ctypes releases the GIL during llama.cpp calls)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class Profile:
    """Where the child's time goes (seconds, summed), written as JSON to ``GGUF_PROFILE`` when it is idle."""

    def __init__(self, path: str, times: Any = None) -> None:
        self.path = path
        self.times: dict[str, float] = {"generations": 0, "tokens": 0, "compute": 0.0, "send": 0.0, "read": 0.0}
        self.steps = times  # the batch's StepTimes, or None

    def write(self) -> None:
        if not self.path:
            return
        report = dict(self.times)
        if self.steps is not None:
            report.update(self.steps.as_dict())
        temporary = f"{self.path}.{os.getpid()}"
        with open(temporary, "w") as out:
            json.dump(report, out)
        os.replace(temporary, self.path)


class Worker:
    """Answers the server's frames, one request at a time."""

    def __init__(self, conn: Connection, engine: GGUFEngine, profile: str = "") -> None:
        self.conn = conn
        self.engine = engine
        self._poll = select.poll()
        self._poll.register(conn.fileno(), select.POLLIN)
        self.profile = Profile(profile)

    def serve(self) -> None:
        conn = self.conn
        while True:
            frame = conn.recv_bytes()
            tag = frame[:1]
            if tag == wire.GENERATE:
                self.generate(*wire.unpack(frame))
            elif tag == wire.EMBED:
                try:
                    vector = self.engine.embed(*wire.unpack(frame))
                    conn.send_bytes(wire.VECTOR + array("f", vector).tobytes())
                except Exception as exc:
                    conn.send_bytes(wire.error_frame(exc))
            elif tag == wire.CLOSE:
                return
            # a STOP that crossed the END of its generation: nothing left to stop

    def generate(self, prompt: list[int], params, vectors) -> None:
        conn, send = self.conn, self.conn.send_bytes
        stops = self.engine.info.eos_token_ids
        times, clock = self.profile.times, time.perf_counter
        count = 0
        try:
            tokens = self.engine.generate_checked(prompt, params, vectors)  # checked by the server
            try:
                started = clock()
                for token in tokens:
                    computed = clock()
                    times["compute"] += computed - started
                    count += 1
                    if count == 1:
                        send(wire.cached_frame(wire.CACHED, self.engine.prompt_cached))
                    # Where the host most likely stops, wait for its word instead of computing on.
                    if token in stops or count >= params.max_tokens:
                        send(wire.token_frame(wire.PAUSED, token))
                        if conn.recv_bytes() != wire.CONTINUE:
                            break
                    else:
                        send(wire.token_frame(wire.TOKEN, token))
                        if self._poll.poll(0) and conn.recv_bytes() == wire.STOP:
                            break
                    started = clock()
                    times["send"] += started - computed
            finally:
                tokens.close()
        except Exception as exc:
            send(wire.error_frame(exc))
            return
        send(wire.END)
        times["generations"] += 1
        times["tokens"] += count
        self.profile.write()


class ParallelWorker:
    """Answers keyed frames (``wire``'s parallel mode): many generations, one decode step each at a time.

    Between two steps it reads every frame waiting, admits new generations as rows
    (``batch``), and answers embeddings. A generation that cannot be a row
    (``serial_reason``: a steered one) waits until the batch is empty, then runs alone
    on the serial context while new ones wait behind it.
    """

    def __init__(self, conn: Connection, engine: GGUFEngine, options: Any) -> None:
        self.conn, self.engine = conn, engine
        llm = engine.llm
        window = engine.info.context_window
        assert window is not None
        self.batch = BatchContext(
            llm.model,
            options.parallel,
            window,
            options.n_batch,
            llm.n_threads,
            llm.n_threads_batch,
            engine.info.eos_token_ids,
            options.flash_attn,
        )
        self.window = window
        self.stops = set(engine.info.eos_token_ids)
        self.waiting: deque[tuple[int, list[int], Any, Any]] = deque()
        self.alone: tuple[int, Generator[int, None, None], Any] | None = None  # key, tokens, params
        self.alone_count = 0
        self.alone_paused = False
        self._poll = select.poll()
        self._poll.register(conn.fileno(), select.POLLIN)
        self.profile = Profile(options.profile, self.batch.times)

    def serve(self) -> None:
        times, clock = self.profile.times, time.perf_counter
        try:
            while True:
                if not self._busy():
                    self.profile.write()
                    if self.handle(self.conn.recv_bytes()):
                        return
                started = clock()
                while self._poll.poll(0):
                    if self.handle(self.conn.recv_bytes()):
                        return
                self._admit()
                times["read"] += clock() - started
                if self.alone is not None and not self.alone_paused:
                    started = clock()
                    self._step_alone()
                    times["compute"] += clock() - started
                elif self.batch.running():
                    self._step_batch()
        finally:
            self.batch.close()

    def _busy(self) -> bool:
        if self.alone is not None:
            return not self.alone_paused
        return self.batch.running() or (bool(self.waiting) and self._can_admit())

    def _can_admit(self) -> bool:
        key, prompt, params, vectors = self.waiting[0]
        if serial_reason(params, vectors):
            return not self.batch.rows
        return self.batch.has_room()

    def handle(self, frame: bytes) -> bool:
        """Act on one frame; True on CLOSE."""
        tag, send = frame[:1], self.conn.send_bytes
        if tag == wire.ROW_GENERATE:
            self.waiting.append(wire.unpack(frame))
        elif tag in (wire.ROW_STOP, wire.ROW_CONTINUE):
            key, _ = wire.frame_key(frame)
            self._signal(key, stop=tag == wire.ROW_STOP)
        elif tag == wire.EMBED:
            try:
                vector = self.engine.embed(*wire.unpack(frame))
                send(wire.VECTOR + array("f", vector).tobytes())
            except Exception as exc:
                send(wire.error_frame(exc))
        elif tag == wire.CLOSE:
            return True
        return False

    def _signal(self, key: int, stop: bool) -> None:
        """STOP or CONTINUE for generation ``key``, wherever it is (a signal for an ended one is ignored)."""
        row = self.batch.rows.get(key)
        if row is not None:
            if stop:
                self._end_row(key)
            else:
                row.paused = False
        elif self.alone is not None and self.alone[0] == key:
            if stop:
                self._end_alone()
            else:
                self.alone_paused = False
        elif stop:
            for item in self.waiting:
                if item[0] == key:
                    self.waiting.remove(item)
                    self.conn.send_bytes(wire.keyed(wire.ROW_END, key))
                    break

    def _admit(self) -> None:
        while self.alone is None and self.waiting and self._can_admit():
            key, prompt, params, vectors = self.waiting.popleft()
            if serial_reason(params, vectors):
                self.alone = (key, self.engine.generate_checked(prompt, params, vectors), params)
                self.alone_count, self.alone_paused = 0, False
                return
            row = self.batch.add(key, prompt, params)
            self.conn.send_bytes(wire.keyed(wire.ROW_CACHED, key, wire.cached_frame(b"", row.cached)))

    def _step_batch(self) -> None:
        try:
            self._emit(self.batch.step())
            self._emit(self.batch.prefill())
        except RuntimeError as exc:  # a failed decode fails every row
            for key in list(self.batch.rows):
                self.batch.forget(key)
                self.conn.send_bytes(wire.keyed(wire.ROW_ERROR, key, wire.error_frame(exc)[1:]))

    def _emit(self, picked: list[tuple[Any, int]]) -> None:
        """Send the rows' tokens, in one bundle (the host most likely stops at an end token or at max_tokens:
        there a row waits for its word)."""
        if not picked:
            return
        started = time.perf_counter()
        frames = []
        for row, token in picked:
            if token in self.stops or row.count >= row.params.max_tokens:
                row.paused = True
                frames.append(wire.keyed(wire.ROW_PAUSED, row.key, wire.token_frame(b"", token)))
            else:
                frames.append(wire.keyed(wire.ROW_TOKEN, row.key, wire.token_frame(b"", token)))
            if row.pos + len(row.feed) >= self.window:  # the next token would not fit
                self.batch.remove(row.key)
                frames.append(wire.keyed(wire.ROW_END, row.key))
                self.profile.times["generations"] += 1
        self.conn.send_bytes(frames[0] if len(frames) == 1 else wire.bundle(frames))
        times = self.profile.times
        times["send"] += time.perf_counter() - started
        times["tokens"] += len(picked)

    def _end_row(self, key: int) -> None:
        self.batch.remove(key)
        self.conn.send_bytes(wire.keyed(wire.ROW_END, key))
        self.profile.times["generations"] += 1

    def _step_alone(self) -> None:
        assert self.alone is not None
        key, tokens, params = self.alone
        send = self.conn.send_bytes
        try:
            token = next(tokens, None)
        except Exception as exc:
            self.alone = None
            send(wire.keyed(wire.ROW_ERROR, key, wire.error_frame(exc)[1:]))
            return
        if token is None:
            self._end_alone()
            return
        self.alone_count += 1
        if self.alone_count == 1:
            send(wire.keyed(wire.ROW_CACHED, key, wire.cached_frame(b"", self.engine.prompt_cached)))
        if token in self.stops or self.alone_count >= params.max_tokens:
            self.alone_paused = True
            send(wire.keyed(wire.ROW_PAUSED, key, wire.token_frame(b"", token)))
        else:
            send(wire.keyed(wire.ROW_TOKEN, key, wire.token_frame(b"", token)))

    def _end_alone(self) -> None:
        assert self.alone is not None
        key, tokens, _ = self.alone
        self.alone = None
        try:
            tokens.close()  # clears its control vectors
        except Exception as exc:
            self.conn.send_bytes(wire.keyed(wire.ROW_ERROR, key, wire.error_frame(exc)[1:]))
            return
        self.conn.send_bytes(wire.keyed(wire.ROW_END, key))


if __name__ == "__main__":
    sys.exit(main())
