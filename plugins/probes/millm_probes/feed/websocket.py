"""The live feed ``probe:results``: a WebSocket with one message per monitored request.

A message carries the request's ``mi.probe.result/v1`` objects in the header's
order, with its session and turn, and never any text (no prompt, reply or
context). ``publish`` runs on the engine thread and only appends to each
client's bounded queue: a client that reads slowly loses its oldest messages
(counted, and told in ``missed`` on the next one it gets), never the server's time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any

from falcon.errors import WebSocketDisconnected

from millm_host.api import InvalidParameter

EVENT = "probe:results"


@dataclass(frozen=True)
class Filters:
    """What a client asked for: some behaviours, some probes, fired results only."""

    behaviours: frozenset[str] = frozenset()
    probes: frozenset[str] = frozenset()
    fired_only: bool = False

    def wants(self, result: dict[str, Any]) -> bool:
        if self.behaviours and result.get("behaviour") not in self.behaviours:
            return False
        if self.probes and result.get("probe_id") not in self.probes:
            return False
        return not self.fired_only or result.get("fires") is True


@dataclass(eq=False)  # hashed by identity: a set of connected clients
class Client:
    """One connected socket's queue (filled from any thread, drained on the event loop)."""

    loop: asyncio.AbstractEventLoop
    filters: Filters
    capacity: int
    queue: collections.deque = field(default_factory=collections.deque)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    missed: int = 0  # dropped since the last message this client got
    missed_total: int = 0

    def offer(self, message: dict[str, Any]) -> None:
        results = [r for r in message["results"] if self.filters.wants(r)]
        if not results:
            return
        with self.lock:
            if len(self.queue) >= self.capacity:
                self.queue.popleft()
                self.missed += 1
                self.missed_total += 1
            self.queue.append({**message, "results": results})
        with contextlib.suppress(RuntimeError):  # the loop closed: the client is gone
            self.loop.call_soon_threadsafe(self.ready.set)

    async def next(self) -> dict[str, Any]:
        while True:
            with self.lock:
                if self.queue:
                    message = self.queue.popleft()
                    message["missed"], message["missed_total"] = self.missed, self.missed_total
                    self.missed = 0
                    return message
                self.ready.clear()
            await self.ready.wait()


class Feed:
    """The connected clients; ``publish`` costs nothing when there are none."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.clients: set[Client] = set()  # replaced whole, never mutated: publish reads it unlocked
        self._lock = threading.Lock()

    def subscribe(self, filters: Filters) -> Client:
        client = Client(asyncio.get_running_loop(), filters, self.capacity)
        with self._lock:
            self.clients = self.clients | {client}
        return client

    def unsubscribe(self, client: Client) -> None:
        with self._lock:
            self.clients = self.clients - {client}

    def publish(
        self,
        results: list[dict[str, Any]],
        *,
        request_id: str | None,
        endpoint: str | None,
        session: Any,
        turn: int | None,
    ) -> None:
        clients = self.clients
        if not clients or not results:
            return
        message = {
            "type": EVENT,
            "request_id": request_id,
            "trace_id": results[0].get("trace_id"),
            "endpoint": endpoint,
            "session_id": session,
            "turn": turn,
            "results": results,
        }
        for client in clients:
            client.offer(message)


def filters_of(req: Any) -> Filters:
    fired = req.get_param("fired")
    if fired is not None and fired.lower() not in ("true", "1", "false", "0"):
        raise InvalidParameter(f"fired must be true or false, not {fired!r}", param="fired")
    return Filters(
        behaviours=frozenset(req.get_param_as_list("behaviour") or ()),
        probes=frozenset(req.get_param_as_list("probe_id") or ()),
        fired_only=fired is not None and fired.lower() in ("true", "1"),
    )


class FeedResource:
    """``/api/probes/feed``: the ``probe:results`` WebSocket (query: behaviour, probe_id, fired)."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed

    async def on_websocket(self, req: Any, ws: Any) -> None:
        """One message per monitored request: its results (filtered), session and turn; never text."""
        filters = filters_of(req)
        await ws.accept()
        client = self.feed.subscribe(filters)
        closed = asyncio.ensure_future(_until_closed(ws))
        try:
            while not closed.done():
                getting = asyncio.ensure_future(client.next())
                await asyncio.wait({getting, closed}, return_when=asyncio.FIRST_COMPLETED)
                if not getting.done():
                    getting.cancel()
                    break
                await ws.send_media(getting.result())
        except WebSocketDisconnected:
            pass
        finally:
            self.feed.unsubscribe(client)
            closed.cancel()
            if not ws.closed:
                with contextlib.suppress(Exception):
                    await ws.close()


async def _until_closed(ws: Any) -> None:
    """Read (and ignore) what the client sends, until it goes away."""
    with contextlib.suppress(Exception):  # a disconnect, or a frame we do not read: either way, done
        while True:
            await ws.receive_text()
