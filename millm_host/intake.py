"""The intake gate: while the engine generates, new requests' intake takes a bounded share of the time.

A request's intake (validation hooks, admission, rendering and tokenizing, the
response's start) is Python on the host's threads, and so is much of a decode
step: they share one interpreter lock. Each time the engine's thread lets the
lock go (inside every tensor operation) a busy intake thread takes it and keeps
it until it blocks or the switch interval ends, so a steady stream of intake
slows every running generation far beyond the CPU it uses. Clients that open
requests and drop them as soon as the headers arrive make such a stream: each
drop costs little, and they loop as fast as the server answers (issue 35: six
steady clients fell to a fifth of their rate beside two of them).

So while a generation runs, requests pass the gate one at a time, each after the
one before it has had its intake and a pause in proportion to it: intake's share
of the time stays at most ``MILLM_INTAKE_SHARE``. A request whose client leaves
while it waits gives up its turn at once and costs nothing more. With no
generation running the gate is open: a burst on an idle server is taken at full
speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

#: A client that leaves while its request waits is seen within this long.
SEE_CLIENT_S = 0.05

#: An intake longer than this (a slow hook, a database that hesitates) counts as this long,
#: and the next request passes without waiting for its end: the pause after it stays short,
#: and a rare slow request does not hold back the ones behind it.
LONGEST_COUNTED_S = 0.02


class IntakeGate:
    """Pace requests' intake while ``generating()``; ``share`` of the time at most (1 or more: never)."""

    def __init__(self, share: float, generating: Callable[[], bool]) -> None:
        self.share = share
        self.generating = generating
        self._turn = asyncio.Lock()  # FIFO: requests pass in the order they came
        self._busy_since: float | None = None  # when the intake that passed last began, until it is done
        self._finished = asyncio.Event()  # set when one is done
        self._open_at = 0.0  # monotonic: when the next request may pass while generating
        self.passed = 0
        self.paced = 0  # requests that waited for their turn
        self.left = 0  # requests whose client left while they waited

    @property
    def active(self) -> bool:
        return 0 < self.share < 1

    async def enter(self, cancel: threading.Event) -> float | None:
        """Wait for this request's turn; returns a token for ``done`` (``None``: it did not wait for one).

        While no generation runs it returns at once. It returns early once ``cancel``
        is set (its client left): the caller checks it.
        """
        if not self.active or not self.generating():
            return None
        async with self._turn:
            waited = False
            while not cancel.is_set() and self.generating():
                now = time.monotonic()
                busy_for = now - self._busy_since if self._busy_since is not None else LONGEST_COUNTED_S
                if busy_for < LONGEST_COUNTED_S:  # the one before is still in its intake
                    self._finished.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._finished.wait(), LONGEST_COUNTED_S - busy_for)
                else:
                    wait = self._open_at - now
                    if wait <= 0:
                        break
                    await asyncio.sleep(min(wait, SEE_CLIENT_S))
                waited = True
            self.paced += waited
            if cancel.is_set():
                self.left += 1
                return None
            self.passed += 1
            self._busy_since = time.monotonic()
            return self._busy_since

    def done(self, passed: float | None) -> None:
        """The intake that ``enter`` let pass (its token) is over: the next waits in proportion to it."""
        if passed is None:
            return
        now = time.monotonic()
        took = min(now - passed, LONGEST_COUNTED_S)
        self._open_at = max(self._open_at, now + took * (1 - self.share) / self.share)
        if self._busy_since == passed:
            self._busy_since = None
            self._finished.set()
