"""Threads for the generations an engine batches: one per call, reused once idle.

Each generation beside the engine thread blocks on its own thread while the batch
makes its tokens (``Scheduler.submit_beside``). ``Thread.start`` waits until the new
thread runs; called on the event loop while a batch holds the GIL, that wait cost
milliseconds per request (a sixth of the loop's time in a storm of dropped streams).
Here a call goes to an idle thread when there is one, and a thread is started only
when none is idle; a thread idle for ``idle_s`` ends.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class ThreadCache:
    """Runs each call on a thread of its own at once: an idle one, or a new one (never queued behind another)."""

    def __init__(self, name: str, idle_s: float = 30.0) -> None:
        self.name = name
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a call that no call has claimed
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()

    def run(self, call: Callable[[], None]) -> None:
        """Start ``call()`` now; it must not raise (the caller reports its outcome itself)."""
        with self._lock:
            self._calls.put(call)
            if self._idle:
                self._idle -= 1  # an idle thread takes it
                return
        threading.Thread(target=self._serve, name=self.name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                call = self._calls.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle:  # still unclaimed: this thread ends, one idle thread fewer
                        self._idle -= 1
                        return
                continue  # a call claimed it just now: it is in the queue
            call()
            del call  # drop the request's references before waiting again
            with self._lock:
                self._idle += 1
