"""The GGUF engine with ``GGUF_PARALLEL`` > 1: several generations at once in the child (server side).

The child decodes them together (``batch``, ``worker.ParallelWorker``); here each
generation runs on a thread of its own (``concurrent_generation``) and its frames
are keyed (``wire``'s parallel mode), a step's frames in one bundle. No thread of
its own reads the child's socket: a generation (or an embedding) that wants its next
frame reads it, when no other does, handing the other generations' frames to their
queues; when it has its own it hands the reading over to one that waits (``_await``).
So a token costs no thread switch of its own: one generation reads its frames itself.
When the child dies, every generation in flight fails with ``engine_crashed``, as in
serial mode, and the supervisor restarts it.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from millm_host.api import LayerHook, SamplingParams, TokenIterator

from . import wire
from .batch import serial_reason
from .control import LayerVectors
from .process import Child, FrameStream, ProcessEngine, _ChildGone


def _gone(child: Child) -> bytes:
    """What a queue gets when ``child`` died (a generation of a later child ignores it)."""
    return b"\0" + child.pid.to_bytes(4, "little")


#: What a waiting queue gets when the reader leaves: read the socket yourself.
_LEAD = b"lead"
#: The key an embedding waits under (generations' keys start at 1).
_EMBEDDING = 0


def _queued(frames: queue.SimpleQueue[bytes]) -> bytes:
    """The next frame already handed to ``frames``, or ``_LEAD`` when there is none yet."""
    try:
        return frames.get_nowait()
    except queue.Empty:
        return _LEAD


class ParallelEngine(ProcessEngine):
    """``ProcessEngine`` whose child serves ``options.parallel`` generations at once."""

    concurrent_generation = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._send_lock = threading.Lock()
        self._streams: dict[int, queue.SimpleQueue[bytes]] = {}
        self._embed_lock = threading.Lock()  # one embedding at a time: its answer is not keyed
        self._keys = itertools.count(1)
        self._reading = threading.Lock()  # held by the thread reading the child's socket
        self._waiting: dict[int, queue.SimpleQueue[bytes]] = {}  # who waits for a frame, by key
        self._waiting_lock = threading.Lock()
        self._counting = threading.Lock()
        self._serial_reasons: collections.Counter[str] = collections.Counter()
        self._batched = 0
        super().__init__(*args, **kwargs)

    def inference(self) -> dict[str, Any]:
        with self._counting:
            reasons, batched = dict(self._serial_reasons), self._batched
        return {
            "backend": "continuous",
            "max_rows": self._options.parallel,
            "batched": batched,
            "serial_reasons": reasons,
        }

    def status(self) -> dict[str, Any]:
        return {**super().status(), "generating": bool(self._streams), "parallel": self._options.parallel}

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
        reason = serial_reason(params, vectors)
        with self._counting:
            if reason is None:
                self._batched += 1
            else:
                self._serial_reasons[reason] += 1
        return RowStream(self, prompt, params, vectors)

    def embed(self, ids: Sequence[int], pooling: str = "mean") -> list[float]:
        with self._embed_lock:
            answers: queue.SimpleQueue[bytes] = queue.SimpleQueue()
            self._streams[_EMBEDDING] = answers
            try:
                child = self._send(wire.pack(wire.EMBED, (list(ids), pooling)), "embedding")
                frame = self._await(_EMBEDDING, answers, child)
            finally:
                self._streams.pop(_EMBEDDING, None)
            if frame == _gone(child):
                raise self._crashed(child, "embedding")
        if frame[:1] == wire.ERROR:
            raise wire.frame_error(frame)
        return array("f", frame[1:]).tolist()

    def close(self) -> None:
        gone = _gone(self._child)
        for key in list(self._streams):
            self._streams[key].put(gone)
        super().close()

    # --- the child --------------------------------------------------------------------
    def _send(self, frame: bytes, doing: str) -> Child:
        """Send ``frame`` to the running child (waiting out a restart); the child it went to."""
        child = self._ready_child()
        try:
            with self._send_lock:
                child.send(frame)
        except _ChildGone:
            raise self._crashed(child, doing) from None
        return child

    def _await(self, key: int, frames: queue.SimpleQueue[bytes], child: Child) -> bytes:
        """The next frame for ``key``: from its queue, or read from the socket while no other thread reads.

        A waiter is listed before it tries to read, so the reader that leaves finds it (``_hand_over``)."""
        with self._waiting_lock:
            self._waiting[key] = frames
        try:
            while True:
                frame = _queued(frames)
                if frame != _LEAD:
                    return frame
                if self._reading.acquire(blocking=False):
                    try:
                        return self._read_until(key, frames, child)
                    finally:
                        self._reading.release()
                        self._hand_over(key)
                frame = frames.get()  # a frame the reader handed over, or the reading itself (_LEAD)
                if frame != _LEAD:
                    return frame
        finally:
            with self._waiting_lock:
                self._waiting.pop(key, None)

    def _read_until(self, key: int, frames: queue.SimpleQueue[bytes], child: Child) -> bytes:
        """Read ``child``'s frames, handing each to its queue, until ``key`` has one."""
        while True:
            frame = _queued(frames)
            if frame != _LEAD:
                return frame
            try:
                frame = child.receive()
            except _ChildGone:
                gone = _gone(child)
                for stream in list(self._streams.values()):
                    stream.put(gone)
                return gone
            if frame[:1] == wire.BUNDLE:
                for part in wire.unbundle(frame):
                    self._deliver(part)
            else:
                self._deliver(frame)

    def _deliver(self, frame: bytes) -> None:
        if frame[:1] in (wire.VECTOR, wire.ERROR):
            key, unkeyed = _EMBEDDING, frame
        else:
            key, unkeyed = wire.frame_key(frame)
        stream = self._streams.get(key)
        if stream is not None:
            stream.put(unkeyed)

    def _hand_over(self, leaving: int) -> None:
        """Wake one waiter (not ``leaving``) to read the socket next."""
        with self._waiting_lock:
            for key, frames in self._waiting.items():
                if key != leaving:
                    frames.put(_LEAD)
                    return


class RowStream(FrameStream):
    """Tokens of one generation in parallel mode, from its queue or read by itself (``ParallelEngine._await``)."""

    TOKEN, PAUSED, END, ERROR, CACHED = wire.ROW_TOKEN, wire.ROW_PAUSED, wire.ROW_END, wire.ROW_ERROR, wire.ROW_CACHED

    def __init__(self, engine: ParallelEngine, prompt: list[int], params: SamplingParams, vectors: LayerVectors):
        self._engine = engine
        self._key = next(engine._keys)
        self._request = wire.pack(wire.ROW_GENERATE, (self._key, prompt, params, vectors))
        self._frames: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._child: Child | None = None
        self._done = False
        self._paused = False

    def _next_frame(self) -> bytes:
        engine = self._engine
        try:
            if self._child is None:
                engine._streams[self._key] = self._frames
                self._child = engine._send(self._request, "generating")
            elif self._paused:
                self._paused = False
                engine._send(wire.keyed(wire.ROW_CONTINUE, self._key), "generating")
        except BaseException:
            self._end()
            raise
        while (frame := engine._await(self._key, self._frames, self._child))[:1] == b"\0":
            if frame == _gone(self._child):
                self._end()
                raise engine._crashed(self._child, "generating") from None
            # an earlier child's end, told while this generation waited for the restart
        return frame

    def close(self) -> None:
        """Stop the generation in the child at its next step; its last frames are dropped when read."""
        if not self._done and self._child is not None:
            try:
                with self._engine._send_lock:
                    self._child.send(wire.keyed(wire.ROW_STOP, self._key))
            except _ChildGone:
                pass  # the supervisor restarts it; this request has its tokens
        self._end()

    def _end(self) -> None:
        self._done = True
        self._engine._streams.pop(self._key, None)
