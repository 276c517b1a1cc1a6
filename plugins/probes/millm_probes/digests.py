"""Identity digests (``mi.probe.identity/v1``): what produced a score, and where its bar was.

Both digests are taken over the document as received (its own numbers, its own
ints and floats), never over a normalised copy, so they agree with the producer's.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

ALGORITHM = "mi.probe.identity/v1"

#: The definition keys that determine the number a probe produces.
DETECTOR_KEYS = ("model", "read", "scope", "basis", "sae", "head", "aggregation", "behaviour")


def canonical(obj: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8, no NaN: the bytes a digest is taken over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def digest(obj: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical(obj)).hexdigest()


def detector_object(document: dict[str, Any]) -> dict[str, Any]:
    """The detector: every key that determines the score (absent keys as null)."""
    return {key: document.get(key) for key in DETECTOR_KEYS}


def detector_digest(document: dict[str, Any]) -> str:
    return digest(detector_object(document))


def decision_digest(decision: dict[str, Any] | None) -> str:
    return digest(decision)


def verify(identity: dict[str, Any] | None, computed: dict[str, str]) -> list[dict[str, str]]:
    """Each digest a document's ``identity`` block states that differs from ``computed``.

    A block naming an algorithm other than ``mi.probe.identity/v1`` raises ``ValueError``.
    """
    if not identity:
        return []
    if identity.get("algorithm") != ALGORITHM:
        raise ValueError(identity.get("algorithm"))
    return [
        {"field": f"identity.{field}", "stated": identity[field], "computed": value}
        for field, value in computed.items()
        if identity.get(field) is not None and identity[field] != value
    ]


def source(identity: dict[str, Any] | None, field: str) -> str:
    """``producer`` when the document stated this digest (and it was verified), else ``computed``."""
    return "producer" if identity and identity.get(field) is not None else "computed"
