"""W3C trace context: a request's results name the trace the request ran in.

That is the host's trace of the request (``current_trace_id``: its span's when
tracing is on, with or without a ``traceparent``, else the caller's, else the
one minted for its log lines), so a result, its span and its log lines join. Off
any request's context, the caller's ``traceparent``, or a new trace.
"""

from __future__ import annotations

import secrets

from millm_host.api import caller_trace, current_trace_id

from ..results import Trace


def trace_id_from(traceparent: str | None) -> str | None:
    """The trace id of a valid ``traceparent``; None for a missing, malformed or repeated one."""
    caller = caller_trace({"traceparent": traceparent or ""})
    return caller[0] if caller else None


def new_trace(headers: dict[str, str]) -> Trace:
    """The request's trace and a new probe-evaluation span."""
    trace_id = current_trace_id() or trace_id_from(headers.get("traceparent")) or secrets.token_hex(16)
    return Trace(trace_id=trace_id, span_id=secrets.token_hex(8))
