"""Query parameters the probes routes share."""

from __future__ import annotations

from millm_host.api import InvalidParameter


def bool_param(req, name: str) -> bool | None:
    """``?name=true|false`` (or 1/0) as a bool; None when absent; a 400 naming it otherwise."""
    raw = req.get_param(name)
    if raw is None:
        return None
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise InvalidParameter(f"{name} must be true or false, not {raw!r}", param=name)
