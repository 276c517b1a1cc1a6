"""Every HTTP request's id and trace id, set before routing, so each log line written for it can be joined to
its trace and its results.

``RequestIdsMiddleware`` (the first Falcon middleware) gives each request a
``RequestIds`` in ``IDS``, a context variable: its ``request_id`` and its
``trace_id`` (the caller's, from a valid ``traceparent``, or minted). The
request's ``Observation`` adopts both, and when tracing is on replaces the
trace id with its span's, so the span, the logs and the probe results name one
trace. The variable is never reset: uvicorn writes its access line when the
response starts, after every middleware has run, in the request's own task.
"""

from __future__ import annotations

import re
import secrets
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

# version - 32 hex trace id - 16 hex parent id - 2 hex flags, lower case (W3C Trace Context)
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass
class RequestIds:
    """One request's ids (mutable: the ``Observation`` may replace the trace id with its span's)."""

    trace_id: str
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


#: The ids of the HTTP request being served in this context (None outside one).
IDS: ContextVar[RequestIds | None] = ContextVar("millm_request_ids", default=None)


def caller_trace(headers: Mapping[str, str]) -> tuple[str, str] | None:
    """``(trace_id, parent span id)`` of a valid W3C ``traceparent``; None for a missing, malformed or
    repeated one (a repeated header arrives joined by commas)."""
    value = headers.get("traceparent", "")
    if not value or "," in value:
        return None
    match = _TRACEPARENT.match(value.strip())
    if match is None:
        return None
    version, trace_id, parent_id, _, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return trace_id, parent_id


def new_ids(headers: Mapping[str, str]) -> RequestIds:
    """A request's ids: the caller's trace, or a new one."""
    caller = caller_trace(headers)
    return RequestIds(trace_id=caller[0] if caller else secrets.token_hex(16))


class RequestIdsMiddleware:
    """Falcon middleware: each request's ``RequestIds``, before routing and before any refusal."""

    async def process_request(self, req: Any, resp: Any) -> None:
        IDS.set(new_ids({"traceparent": req.get_header("traceparent") or ""}))
