"""``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/responses``: one resource, one call.

The body is read and checked here (HTTP); the request is served by
``host.serving[endpoint].handle`` (no HTTP), and its ``Result`` written back: a
JSON body, or server-sent events.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

import falcon
from falcon.asgi import SSEvent

from ..bodies.encode import encoded, is_large
from ..intake import CONNECTION
from ..openapi import Operation
from ..scheduler import TICK
from ..serving.base import Chunks, ClientGone
from .common import lower_headers, read_json

if TYPE_CHECKING:
    from ..serving.base import Serving
    from ..settings import Settings


class EndpointHost(Protocol):
    """What an OpenAI endpoint's resource uses of the host."""

    serving: dict[str, Serving]
    settings: Settings


class ServingResource:
    """One OpenAI endpoint, served by ``host.serving[endpoint]``."""

    def __init__(self, host: EndpointHost, endpoint: str) -> None:
        self.host = host
        self.endpoint = endpoint

    def describe_operation(self, method: str, suffix: str | None) -> Operation:
        """``/openapi.json``: what the endpoint's serving takes and answers."""
        return self.host.serving[self.endpoint].describe()

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await read_json(req, self.host.settings)
        # a client that leaves cancels its request, streamed or not
        serving = self.host.serving[self.endpoint]
        client = req.scope.get("client")  # the connection (address, port): the intake gate knows answered ones
        token = CONNECTION.set(tuple(client) if client else None)
        try:
            result = await serving.observed(body, lower_headers(req), gone=client_gone(req))
        finally:
            CONNECTION.reset(token)
        resp.set_headers(result.headers)
        if result.stream is not None:
            resp.sse = _events(result.stream, named=serving.named_events)
        else:
            resp.media = result.body


def client_gone(req: falcon.asgi.Request) -> ClientGone | None:
    """Waits for the client to disconnect (call it once the body has been read).

    It waits on the ASGI receive channel for ``http.disconnect``. Falcon offers
    no public accessor for that channel, hence ``req._receive``; without one
    (another server adapter) nothing is watched.
    """
    receive = getattr(req, "_receive", None)
    if receive is None:
        return None

    async def gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            await asyncio.sleep(TICK)  # not expected once the body is read; never spin

    return gone


async def _events(items: Chunks, *, named: bool = False) -> AsyncIterator[SSEvent | None]:
    """``named``: each event also carries its ``type`` as the SSE ``event:`` (the Responses API's stream)."""
    try:
        async for item in items:
            if item is None:
                yield None
            else:
                event = item.get("type") if named and isinstance(item, dict) else None
                # a large chunk (a finish chunk with many probe results) is encoded off the loop
                data = await asyncio.to_thread(encoded, item, compact=True) if is_large(item) else sse_data(item)
                yield SSEvent(data=data, event=event)
    finally:
        await items.aclose()


def sse_data(item: dict[str, Any] | str) -> bytes:
    if isinstance(item, str):
        return item.encode()
    return json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode()
