"""W3C trace context: results join the caller's trace, or a new one is minted."""

from __future__ import annotations

import re
import secrets

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
    """The request's trace (from ``traceparent`` or minted) and a new probe-evaluation span."""
    trace_id = trace_id_from(headers.get("traceparent")) or secrets.token_hex(16)
    return Trace(trace_id=trace_id, span_id=secrets.token_hex(8))
