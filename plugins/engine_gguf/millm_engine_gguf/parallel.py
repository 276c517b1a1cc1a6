"""The GGUF engine with ``GGUF_PARALLEL`` > 1: several generations at once in the child (server side).

The child decodes them together (``batch``, ``worker.ParallelWorker``); here each
generation runs on a thread of its own (``concurrent_generation``) and its frames
are keyed (``wire``'s parallel mode). One reader thread per child hands each
frame to its generation's queue, and an embedding's answer to the one waiting
embedding. When the child dies, every generation in flight fails with
``engine_crashed``, as in serial mode, and the supervisor restarts it.
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

#: What a queue gets when its child died.
_GONE = b""


class ParallelEngine(ProcessEngine):
    """``ProcessEngine`` whose child serves ``options.parallel`` generations at once."""

    concurrent_generation = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._send_lock = threading.Lock()
        self._streams: dict[int, queue.SimpleQueue[bytes]] = {}
        self._embedding: queue.SimpleQueue[bytes] | None = None
        self._embed_lock = threading.Lock()  # one embedding at a time: its answer is not keyed
        self._keys = itertools.count(1)
        self._reader_of: Child | None = None
        self._reader_lock = threading.Lock()
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
            self._embedding = answers
            try:
                child = self._send(wire.pack(wire.EMBED, (list(ids), pooling)), "embedding")
                frame = answers.get()
            finally:
                self._embedding = None
            if frame == _GONE:
                raise self._crashed(child, "embedding")
        if frame[:1] == wire.ERROR:
            raise wire.frame_error(frame)
        return array("f", frame[1:]).tolist()

    def close(self) -> None:
        for key in list(self._streams):
            self._streams[key].put(_GONE)
        super().close()

    # --- the child --------------------------------------------------------------------
    def _send(self, frame: bytes, doing: str) -> Child:
        """Send ``frame`` to the running child (waiting out a restart); the child it went to."""
        child = self._ready_child()
        self._start_reader(child)
        try:
            with self._send_lock:
                child.send(frame)
        except _ChildGone:
            raise self._crashed(child, doing) from None
        return child

    def _start_reader(self, child: Child) -> None:
        with self._reader_lock:
            if self._reader_of is child:
                return
            self._reader_of = child
        threading.Thread(target=self._read, args=(child,), name="gguf-reader", daemon=True).start()

    def _read(self, child: Child) -> None:
        """Hand each frame of ``child`` to whoever waits for it, until the child's socket closes."""
        try:
            while True:
                frame = child.receive()
                if frame[:1] in (wire.VECTOR, wire.ERROR):
                    if self._embedding is not None:
                        self._embedding.put(frame)
                    continue
                key, unkeyed = wire.frame_key(frame)
                stream = self._streams.get(key)
                if stream is not None:
                    stream.put(unkeyed)
        except _ChildGone:
            pass
        for stream in list(self._streams.values()):
            stream.put(_GONE)
        if self._embedding is not None:
            self._embedding.put(_GONE)


class RowStream(FrameStream):
    """Tokens of one generation in parallel mode, as the reader thread hands them over."""

    TOKEN, PAUSED, END, ERROR = wire.ROW_TOKEN, wire.ROW_PAUSED, wire.ROW_END, wire.ROW_ERROR

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
        frame = self._frames.get()
        if frame == _GONE:
            self._end()
            raise engine._crashed(self._child, "generating") from None
        return frame

    def close(self) -> None:
        """Stop the generation in the child at its next step; its last frames are dropped by the reader."""
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
