"""``POST /v1/embeddings``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import falcon.asgi

from ..serving.embeddings import serve_embeddings
from .common import lower_headers, read_json

if TYPE_CHECKING:
    from ..app import Host


class EmbeddingsResource:
    """OpenAI's embeddings endpoint; always unsteered."""

    def __init__(self, host: Host) -> None:
        self.host = host

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        body = await read_json(req, self.host.settings)
        payload, headers = await serve_embeddings(self.host, body, lower_headers(req))
        resp.set_headers(headers)
        resp.media = payload
