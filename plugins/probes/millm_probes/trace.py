"""W3C trace context: a request's results name the trace the request ran in.

That is the host's trace of the request (``current_trace_id``: its span's when
tracing is on, with or without a ``traceparent``, else the caller's, else the
one minted for its log lines), so a result, its span and its log lines join. Off
any request's context, the caller's ``traceparent``, or a new trace.
"""

from __future__ import annotations

import re
import secrets

from millm_host.api import current_trace_id

from .results import Trace

# version "00" - 32 hex trace id - 16 hex parent id - 2 hex flags (lower-case only)
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


def trace_id_from(traceparent: str | None) -> str | None:
    """The trace id of a valid ``traceparent``; None for a missing, malformed or repeated one."""
    if not traceparent or "," in traceparent:  # a repeated header arrives joined by commas
        return None
    match = _TRACEPARENT.match(traceparent.strip())
    if match is None:
        return None
    version, trace_id, parent_id, _, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return trace_id


def new_trace(headers: dict[str, str]) -> Trace:
    """The request's trace and a new probe-evaluation span."""
    trace_id = current_trace_id() or trace_id_from(headers.get("traceparent")) or secrets.token_hex(16)
    return Trace(trace_id=trace_id, span_id=secrets.token_hex(8))
