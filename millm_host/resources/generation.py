"""``POST /v1/chat/completions`` and ``POST /v1/completions``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

import falcon
from falcon.asgi import SSEvent

from ..errors import ClientDisconnected, RequestCancelled
from ..serving.run import collect_headers, complete, sse_data, stream, watch_client
from .common import lower_headers, read_json

if TYPE_CHECKING:
    from ..app import Host


class GenerationResource:
    """One OpenAI generation endpoint; scoring requests go to the scoring service."""

    def __init__(self, host: Host, endpoint: str) -> None:
        self.host = host
        self.endpoint = endpoint

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        host = self.host
        body = await read_json(req, host.settings)
        # validation takes time in proportion to the body: off the event loop
        ctx = await asyncio.to_thread(host.pipeline.build_context, self.endpoint, body, lower_headers(req))
        if ctx.scoring:
            payload, headers = await host.scoring(host, ctx)
            resp.media = payload
            resp.set_headers(headers)
            return
        gone = watch_client(req, ctx)  # a client that leaves cancels its request, streamed or not
        try:
            admission = await host.pipeline.prepare(ctx)
        except BaseException as exc:
            if gone is not None:
                gone.cancel()
            if isinstance(exc, RequestCancelled):
                raise ClientDisconnected("the client went away before the request was prepared") from None
            raise
        if ctx.streaming:
            resp.set_headers(collect_headers(host, ctx))
            resp.sse = _events(stream(host, ctx, admission, gone))
            return
        payload, headers = await complete(host, ctx, admission, gone)
        resp.set_headers(headers)
        resp.media = payload


async def _events(items: AsyncGenerator[dict[str, Any] | str | None, None]) -> AsyncIterator[SSEvent | None]:
    try:
        async for item in items:
            yield None if item is None else SSEvent(data=sse_data(item))
    finally:
        await items.aclose()
