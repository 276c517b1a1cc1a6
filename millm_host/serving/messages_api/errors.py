"""Refusals in Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``.

The HTTP status stays millm's; the error's ``type`` is Anthropic's name for it.
millm's own ``code`` and ``param`` ride along inside ``error`` (a client that
reads only ``type`` and ``message`` is not disturbed).
"""

from __future__ import annotations

from typing import Any

from ...errors import MillmError

#: The paths whose refusals are written in Anthropic's shape (the error handlers look here).
PATHS = ("/v1/messages", "/v1/messages/count_tokens")

#: Anthropic's error type for each status it names; any other 4xx is an ``invalid_request_error``.
TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}

#: millm codes a stream ends with that say "busy, try again" rather than "broken".
_OVERLOADED = frozenset({"generation_stalled", "shutting_down", "queue_full", "model_busy"})


def is_messages_path(path: str) -> bool:
    """Whether a refusal on ``path`` is written in Anthropic's shape."""
    return path in PATHS


def error_type(status: int) -> str:
    if status in TYPES:
        return TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_body(error: MillmError) -> dict[str, Any]:
    """The whole body of a refusal."""
    return _body(error_type(error.status), error.to_dict())


def stream_error(error: dict[str, Any]) -> dict[str, Any]:
    """An ``error`` event for a chat stream's error (an OpenAI error object, its status gone)."""
    if error.get("code") in _OVERLOADED:
        kind = "overloaded_error"
    else:
        kind = "invalid_request_error" if error.get("type") == "invalid_request_error" else "api_error"
    return _body(kind, error)


def _body(kind: str, openai: dict[str, Any]) -> dict[str, Any]:
    inner: dict[str, Any] = {"type": kind, "message": openai.get("message") or ""}
    for key, value in openai.items():  # millm's code, param and any detail a refusal carries
        if key not in ("type", "message") and value is not None:
            inner[key] = value
    return {"type": "error", "error": inner}
