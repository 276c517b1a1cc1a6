"""Reading JSON bodies and rendering errors, shared by every resource."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import falcon
import falcon.asgi

from ..errors import InternalError, MillmError
from ..protocol import parse_json_body
from ..settings import Settings

log = logging.getLogger("millm.http")


class UnsupportedMediaType(MillmError):
    status, code = 415, "unsupported_media_type"


class BodyTooLarge(MillmError):
    status, code = 413, "request_too_large"


async def read_json(req: falcon.asgi.Request, settings: Settings, *, required: bool = True) -> dict[str, Any]:
    """The body as a JSON object: 415 for another media type, 413 past the size limit."""
    raw = await read_body(req, settings, required=required)
    return parse_json_body(raw, settings["MILLM_MAX_JSON_DEPTH"]) if raw else {}


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
    media = (req.content_type or "application/json").split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise UnsupportedMediaType(f"the request body must be application/json, not {media}")
    return raw


def lower_headers(req: falcon.asgi.Request) -> dict[str, str]:
    return {k.lower(): v for k, v in req.headers.items()}


def render_error(resp: falcon.asgi.Response, error: MillmError) -> None:
    resp.status = error.status
    resp.content_type = falcon.MEDIA_JSON
    resp.text = json.dumps({"error": error.to_dict()})
    for name, value in error.headers.items():
        resp.set_header(name, value)


async def handle_millm_error(req, resp, ex: MillmError, params) -> None:
    render_error(resp, ex)


async def handle_http_error(req, resp, ex: falcon.HTTPError, params) -> None:
    """Falcon's own errors (unknown route, wrong method) in OpenAI's shape."""
    status = ex.status_code if hasattr(ex, "status_code") else int(str(ex.status).split()[0])
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "invalid_request")
    message = ex.description or ex.title or "request failed"
    render_error(resp, MillmError(message, code=code, status=status,
                                  type="invalid_request_error" if status < 500 else "server_error"))
    headers = ex.headers or {}
    for name, value in headers.items() if isinstance(headers, Mapping) else headers:
        resp.set_header(name, value)


async def handle_unexpected(req, resp, ex: Exception, params) -> None:
    if isinstance(ex, falcon.HTTPError):
        await handle_http_error(req, resp, ex, params)
        return
    log.exception("unhandled error on %s %s", req.method, req.path)
    render_error(resp, InternalError(f"internal error: {type(ex).__name__}"))
