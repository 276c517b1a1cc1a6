"""The applied steering set, its canonical form and its hash (``millm.steering-set/v1``).

The hash lets a client check, from the set it sent, that an answer ran under
that set. It covers the SAE id and the applied strengths (as IEEE-754 bit
patterns, so no decimal formatting is involved); the layer travels beside it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The ± bound every strength is clamped to at apply time.
STRENGTH_LIMIT = 200.0

CANONICAL_HEADER = "millm.steering-set/v1"


@dataclass(frozen=True)
class AppliedSet:
    """``index → strength`` as the hook applies it (clamped, zeros removed) and how many the clamp changed."""

    values: Mapping[int, float]
    clamped: int = 0


def clamp(strength: float) -> float:
    return max(-STRENGTH_LIMIT, min(STRENGTH_LIMIT, strength))


def applied_set(features: Iterable[tuple[int, float]], scale: float = 1.0) -> AppliedSet:
    """``clamp(strength × scale)`` per feature in binary64, every zero (``-0.0`` too) removed.

    ``clamped`` counts the features whose value the clamp changed.
    """
    values: dict[int, float] = {}
    clamped = 0
    for index, strength in features:
        scaled = float(strength) * scale
        bounded = clamp(scaled)
        if bounded != scaled:
            clamped += 1
        if bounded != 0.0:
            values[int(index)] = bounded
    return AppliedSet(dict(sorted(values.items())), clamped)


def canonical_form(sae_id: str, values: Mapping[int, float]) -> bytes:
    """The UTF-8 lines the hash covers, each ended by one LF."""
    lines = [CANONICAL_HEADER, f"sae={sae_id}"]
    lines += [f"{index}:{struct.pack('>d', values[index]).hex()}" for index in sorted(values)]
    return "".join(line + "\n" for line in lines).encode("utf-8")


def steering_hash(sae_id: str, values: Mapping[int, float]) -> str:
    """``sha256:`` + 64 lowercase hex digits of the canonical form of an applied set."""
    return "sha256:" + hashlib.sha256(canonical_form(sae_id, values)).hexdigest()
