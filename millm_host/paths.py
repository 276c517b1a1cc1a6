"""Paths a client names, kept inside the directories the operator configured.

A route that takes a filesystem path (``POST /api/saes``) resolves it here: an
absolute path must lie inside one of the roots, a relative one is taken inside
them. ``..`` and ``~`` are refused outright, and a path outside every root is
refused before anything is read from it, so the answer never says whether a
path outside exists.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path, PurePath

from .errors import InvalidParameter

#: Longest file-name component most file systems accept (bytes).
NAME_MAX = 255


def plain_name(value: str, param: str) -> str:
    """``value`` if it names one entry of a directory (no separator, not ``.``/``..``); else 400."""
    if not value or value in (".", "..") or "/" in value or "\\" in value or "\x00" in value:
        raise InvalidParameter(f"{param} must be a plain name, not a path", param=param)
    if len(value.encode("utf-8", "surrogatepass")) > NAME_MAX:
        raise InvalidParameter(f"{param} is longer than {NAME_MAX} bytes", param=param)
    return value


def confined_path(value: str, roots: Sequence[Path], *, param: str, setting: str) -> Path:
    """The resolved directory ``value`` names inside ``roots``; 400 ``invalid_parameter`` otherwise."""
    if "\x00" in value:
        raise InvalidParameter(f"{param} holds a NUL character", param=param)
    pure = PurePath(value)
    if ".." in pure.parts:
        raise InvalidParameter(f"{param} may not contain '..'", param=param)
    if value.startswith("~"):
        raise InvalidParameter(f"{param} may not start with '~': give the path inside {setting}", param=param)
    if any(len(part.encode("utf-8", "surrogatepass")) > NAME_MAX for part in pure.parts):
        raise InvalidParameter(f"{param} has a component longer than {NAME_MAX} bytes", param=param)
    resolved_roots = [Path(os.path.realpath(root)) for root in roots]
    candidates = [pure] if pure.is_absolute() else [root / pure for root in resolved_roots]
    inside = []
    for candidate in candidates:
        resolved = Path(os.path.realpath(candidate))  # symlinks followed: a link may not lead out
        if any(resolved == root or root in resolved.parents for root in resolved_roots):
            inside.append(resolved)
    if not inside:
        where = ", ".join(str(r) for r in resolved_roots) or "(none)"
        raise InvalidParameter(f"{param} must be inside the directories {setting} allows: {where}", param=param)
    return next((p for p in inside if p.is_dir()), inside[0])
