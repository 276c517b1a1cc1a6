"""The intake gate: requests whose clients leave before their answer pay for it in time, not the batch.

A request's intake (validation hooks, admission, rendering and tokenizing, the
response's start) is Python on the host's threads, and so is much of a decode
step: they share one interpreter lock. Each time the engine's thread lets the
lock go (inside every tensor operation) a busy intake thread takes it and keeps
it until it blocks or the switch interval ends, so a steady stream of intake
slows every running generation far beyond the CPU it uses. Clients that open
requests and drop them as soon as the headers arrive make such a stream: each
drop costs little, and they loop as fast as the server answers (issue 35: six
steady clients kept a fifth of their rate beside two of them).

So a request whose client leaves before its answer is complete is charged its
intake: the gate stays closed after it for that long times ``(1 - share) / share``
(``MILLM_INTAKE_SHARE``), and while a generation runs in this process new
requests wait, in the order they came, until it opens. The drops' intake then
takes at most ``share`` of the time, whatever their rate. A request that is
answered costs the ones behind it nothing, so a burst of real requests (the batch
refilling) passes at once; a request whose client leaves while it waits gives up
its turn and costs nothing more. With no generation running the gate is open.

A request on a connection whose last request was answered does not wait: a client
that drops a response must close its connection (HTTP/1.1 has no other way to stop
one), so a dropper always comes on a new connection, while clients that keep theirs
(the OpenAI SDK's pool, a proxy's upstream keep-alive) pass the gate at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextvars import ContextVar

#: The connection the current request came on (the peer's address and port: ASGI's ``client``),
#: set by the resource that reads the request; None where the server does not say.
CONNECTION: ContextVar[Hashable | None] = ContextVar("millm_connection", default=None)

#: Connections whose last request was answered that the gate remembers (the oldest are forgotten).
REMEMBERED_CONNECTIONS = 4096

#: A client that leaves while its request waits is seen within this long.
SEE_CLIENT_S = 0.05

#: An intake longer than this (a slow hook, a database that hesitates) is charged as this long:
#: the gate is never closed for long by one request.
LONGEST_CHARGED_S = 0.02


class IntakeGate:
    """While ``generating()``, requests wait for the time their predecessors' drops were charged."""

    def __init__(self, share: float, generating: Callable[[], bool]) -> None:
        self.share = share
        self.generating = generating
        self._turn = asyncio.Lock()  # FIFO: requests pass in the order they came
        self._open_at = 0.0  # monotonic: when the gate opens again
        self._answered: OrderedDict[Hashable, None] = OrderedDict()  # connections whose last request was
        self.charged = 0  # requests whose clients left before their answer
        self.paced = 0  # requests that waited for the gate
        self.left = 0  # requests whose client left while they waited

    @property
    def active(self) -> bool:
        return 0 < self.share < 1

    async def enter(self, cancel: threading.Event, connection: Hashable | None = None) -> None:
        """Wait until the gate is open (at once while no generation runs in this process, or when the
        request came on ``connection`` and that connection's last request was answered).

        Returns early once ``cancel`` is set (its client left): the caller checks it.
        """
        if not self.active or not self.generating() or time.monotonic() >= self._open_at:
            return
        if connection is not None and connection in self._answered:
            return
        self.paced += 1
        async with self._turn:
            while not cancel.is_set() and self.generating():
                wait = self._open_at - time.monotonic()
                if wait <= 0:
                    return
                await asyncio.sleep(min(wait, SEE_CLIENT_S))
            if cancel.is_set():
                self.left += 1

    def answered(self, connection: Hashable | None) -> None:
        """The request that came on ``connection`` was answered: the next one on it need not wait."""
        if connection is None or not self.active:
            return
        self._answered[connection] = None
        self._answered.move_to_end(connection)
        while len(self._answered) > REMEMBERED_CONNECTIONS:
            self._answered.popitem(last=False)

    def charge(self, held_s: float, connection: Hashable | None = None) -> None:
        """A request that held the server ``held_s`` lost its client (on ``connection``) before its answer:
        close the gate."""
        if not self.active:
            return
        self._answered.pop(connection, None)
        self.charged += 1
        pause = min(held_s, LONGEST_CHARGED_S) * (1 - self.share) / self.share
        self._open_at = max(self._open_at, time.monotonic()) + pause
