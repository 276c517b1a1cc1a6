"""The bounded request queue and the engine thread.

One engine thread runs all model work (loads, generation, scoring) in order, so
a model is never touched by two threads. Requests reserve a place before doing
any work; when ``MILLM_QUEUE_MAX`` requests already wait for the slot the next
one is refused with ``503 queue_full``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .errors import QueueFull, RequestCancelled

T = TypeVar("T")


class Ticket:
    """A reserved place in the queue; released exactly once."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._scheduler._release()

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Scheduler:
    """Admission control plus a single engine thread."""

    def __init__(self, queue_max: int) -> None:
        self.queue_max = queue_max
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="millm-engine")
        self._lock = threading.Lock()
        self._admitted = 0  # waiting + running
        self.engine_thread_id: int | None = None

    @property
    def admitted(self) -> int:
        return self._admitted

    def reserve(self) -> Ticket:
        """Take a place in the queue or raise ``QueueFull``. One runs, ``queue_max`` wait."""
        with self._lock:
            if self._admitted >= self.queue_max + 1:
                raise QueueFull(
                    f"the request queue is full ({self.queue_max} waiting); retry later"
                )
            self._admitted += 1
        return Ticket(self)

    def _release(self) -> None:
        with self._lock:
            self._admitted -= 1

    async def run(self, fn: Callable[..., T], *args: Any, cancel: threading.Event | None = None) -> T:
        """Run ``fn(*args)`` on the engine thread, in order; skip it if cancelled while queued."""

        def job() -> T:
            self.engine_thread_id = threading.get_ident()
            if cancel is not None and cancel.is_set():
                raise RequestCancelled()
            return fn(*args)

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, job)

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` on the engine thread from a non-async thread and wait for it."""
        if threading.get_ident() == self.engine_thread_id:
            return fn(*args)
        return self._executor.submit(fn, *args).result()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
