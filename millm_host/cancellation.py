"""A request's cancellation: a ``threading.Event`` that also wakes whoever waits on the event loop.

The engine, text and generation threads look at it between steps (``is_set``), as
they look at any ``threading.Event``. A coroutine that waits for one of those
threads (``Scheduler._wait``) is woken the moment it is set, instead of at its next
poll: a request whose client has gone leaves the queue at once, not a tick later.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable


class Cancellation(threading.Event):
    """``RequestContext.cancel_event``: set once the client has gone or the host ends the request."""

    def __init__(self) -> None:
        super().__init__()
        self._guard = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        with self._guard:
            super().set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once it is set (now, if it is), on the thread that sets it; returns a remover."""
        with self._guard:
            if not self.is_set():
                self._callbacks.append(callback)
                return lambda: self._remove(callback)
        callback()
        return lambda: None

    def _remove(self, callback: Callable[[], None]) -> None:
        with self._guard:
            if callback in self._callbacks:
                self._callbacks.remove(callback)


def when_set(cancel: threading.Event) -> tuple[asyncio.Future | None, Callable[[], None]]:
    """A future of the running loop resolved once ``cancel`` is set, and a remover to call when done.

    None for a plain ``threading.Event`` (one a plugin made): its waiter polls it instead.
    """
    if not isinstance(cancel, Cancellation):
        return None, lambda: None
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def resolve() -> None:
        if not future.done():
            future.set_result(None)

    def woken() -> None:  # on the thread that set it
        try:
            loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    remove = cancel.add_callback(woken)

    def done() -> None:
        remove()
        future.cancel()

    return future, done
