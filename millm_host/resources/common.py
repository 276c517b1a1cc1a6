"""Reading JSON bodies and rendering errors, shared by every resource."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

import falcon
import falcon.asgi

from ..access import check_media_type
from ..bodies.read import parse_json_body
from ..errors import InternalError, MillmError
from ..serving.messages_api.errors import error_body as messages_error, is_messages_path
from ..settings import Settings

log = logging.getLogger("millm.http")


class BodyTooLarge(MillmError):
    status, code = 413, "request_too_large"


#: Bodies past this many bytes are parsed on a worker thread, so the event loop never waits on one.
PARSE_INLINE_MAX_BYTES = 64 * 1024


async def read_json(req: falcon.asgi.Request, settings: Settings, *, required: bool = True) -> dict[str, Any]:
    """The body as a JSON object: 415 for another media type, 413 past the size limit."""
    raw = await read_body(req, settings, required=required)
    return await parse_json(raw, settings) if raw else {}


async def parse_json(raw: bytes, settings: Settings) -> dict[str, Any]:
    """``bodies.read.parse_json_body`` with the configured bounds, off the event loop for a large body."""
    depth, containers = settings["MILLM_MAX_JSON_DEPTH"], settings["MILLM_MAX_JSON_CONTAINERS"]
    if len(raw) <= PARSE_INLINE_MAX_BYTES:
        return parse_json_body(raw, depth, containers)
    return await asyncio.to_thread(parse_json_body, raw, depth, containers)


async def read_body(req: falcon.asgi.Request, settings: Settings, *, required: bool = True) -> bytes:
    """The raw bytes of a JSON body, checked like ``read_json`` checks them (b"" when optional and absent)."""
    limit = settings["MILLM_MAX_BODY_BYTES"]
    if req.content_length is not None and req.content_length > limit:
        raise BodyTooLarge(f"the request body is {req.content_length} bytes; the limit is {limit}")
    raw = await req.stream.read(limit + 1)
    if len(raw) > limit:
        raise BodyTooLarge(f"the request body is over the {limit}-byte limit")
    if not raw:
        if not required:
            return b""
        raise MillmError("the request body is empty; send a JSON object", code="invalid_request")
    check_media_type(req)  # the access middleware's check, for a route it did not see as state-changing
    return raw


def lower_headers(req: falcon.asgi.Request) -> dict[str, str]:
    return {k.lower(): v for k, v in req.headers.items()}


def render_error(resp: falcon.asgi.Response, error: MillmError, path: str = "") -> None:
    """The error in OpenAI's shape (in Anthropic's on ``path`` ``/v1/messages``); every 503 says when to
    retry (``Retry-After``)."""
    resp.status = error.status
    resp.content_type = falcon.MEDIA_JSON
    resp.text = json.dumps(messages_error(error) if is_messages_path(path) else {"error": error.to_dict()})
    if error.status == 503:
        resp.set_header("Retry-After", str(error.retry_after))
    for name, value in error.headers.items():
        resp.set_header(name, value)


async def close_websocket(ws, status: int) -> None:
    """A refused WebSocket closes with ``3000 + status`` (Falcon's mapping: 401 is 3401), or 1011."""
    if not ws.closed:
        await ws.close(3000 + status if 400 <= status < 500 else 1011)


async def handle_millm_error(req, resp, ex: MillmError, params, ws=None) -> None:
    if ws is not None:
        await close_websocket(ws, ex.status)
        return
    render_error(resp, ex, req.path)


async def handle_http_error(req, resp, ex: falcon.HTTPError, params, ws=None) -> None:
    """Falcon's own errors (unknown route, wrong method) in OpenAI's shape."""
    status = ex.status_code if hasattr(ex, "status_code") else int(str(ex.status).split()[0])
    if ws is not None:
        await close_websocket(ws, status)
        return
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid_request")
    message = ex.description or ex.title or "request failed"
    render_error(
        resp,
        MillmError(message, code=code, status=status, type="invalid_request_error" if status < 500 else "server_error"),
        req.path,
    )
    headers = ex.headers or {}
    for name, value in headers.items() if isinstance(headers, Mapping) else headers:
        resp.set_header(name, value)


async def handle_unexpected(req, resp, ex: Exception, params, ws=None) -> None:
    if isinstance(ex, falcon.HTTPError):
        await handle_http_error(req, resp, ex, params, ws)
        return
    log.exception("unhandled error on %s %s", req.method, req.path)
    if ws is not None:
        await close_websocket(ws, 500)
        return
    render_error(resp, InternalError(f"internal error: {type(ex).__name__}"), req.path)


class JsonResource:
    """Base of a JSON route, the host's or a plugin's: bodies are read and checked the host's way.

    Subclasses define Falcon's ``on_get``/``on_post``/... and raise ``MillmError``s,
    which the app renders in OpenAI's shape.
    """

    def __init__(self, host: Any) -> None:
        self.host = host

    async def json(self, req: falcon.asgi.Request, *, required: bool = True) -> dict[str, Any]:
        """The body as a JSON object (``{}`` when optional and absent); 413, 415 and 400 as ``read_json``."""
        return await read_json(req, self.host.settings, required=required)

    async def raw_body(self, req: falcon.asgi.Request, *, required: bool = True) -> bytes:
        """The body's bytes, checked like ``json`` checks them, for a plugin that stores them verbatim."""
        return await read_body(req, self.host.settings, required=required)

    async def parse_json(self, raw: bytes) -> Any:
        """``raw`` parsed as ``json`` parses a body (the depth limit included; off the event loop when large)."""
        return await parse_json(raw, self.host.settings)

    @staticmethod
    def headers(req: falcon.asgi.Request) -> dict[str, str]:
        """The request's headers, names lower-cased."""
        return lower_headers(req)
