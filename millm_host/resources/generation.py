"""``POST /v1/chat/completions`` and ``POST /v1/completions``."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any

import falcon
from falcon.asgi import SSEvent

from ..serving.run import collect_headers, complete, sse_data, stream
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
        ctx = host.pipeline.build_context(self.endpoint, body, lower_headers(req))
        if ctx.scoring:
            payload, headers = await host.scoring(host, ctx)
            resp.media = payload
            resp.set_headers(headers)
            return
        admission = await host.pipeline.prepare(ctx)
        if ctx.streaming:
            resp.set_headers(collect_headers(host, ctx))
            resp.sse = _events(stream(host, ctx, admission))
            return
        payload, headers = await complete(host, ctx, admission)
        resp.set_headers(headers)
        resp.media = payload


async def _events(items: AsyncGenerator[dict[str, Any] | str | None, None]) -> AsyncIterator[SSEvent | None]:
    try:
        async for item in items:
            yield None if item is None else SSEvent(data=sse_data(item))
    finally:
        await items.aclose()
