"""The imported documents, ``mi.cluster/v1`` and ``mi.circuit/v1``, read into what steering applies.

A document is stored as received (re-export is lossless); these readers check it
and take out the fields steering uses. Unknown keys are kept in the stored copy
and never change behaviour. ``param`` names the bad field the way the rest of the
API does (``members[1].features[0].strength``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from millm_host.api import InvalidParameter

from .features import Features, non_negative_int, parse_features

CLUSTER_FORMAT = "mi.cluster/v1"
CIRCUIT_FORMAT = "mi.circuit/v1"
#: Ids appear in URLs and in header Strings.
DOCUMENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~\-]{0,199}$")
#: The evidence ladder (spec: X-miLLM-Circuit-Rung), rendered server-side, never per request.
RUNG_LANGUAGE = {
    0: "associated",
    1: "suggested (attribution-supported)",
    2: "causally validated (edge)",
    3: "faithfulness-tested (circuit)",
}

Range = tuple[float, float]


@dataclass(frozen=True)
class ClusterDoc:
    """A cluster as steering applies it: a feature set on one SAE, scaled by its dial."""

    cluster_id: str
    name: str
    sae_id: str
    layer: int
    features: Features
    intensity_range: Range | None


@dataclass(frozen=True)
class Member:
    """One layer of a circuit: a feature set on that layer's SAE."""

    sae_id: str
    layer: int
    features: Features

    @property
    def key(self) -> tuple[str, int]:
        return (self.sae_id, self.layer)


@dataclass(frozen=True)
class CircuitDoc:
    """A circuit as steering applies it: members on several layers, one dial, an evidence rung."""

    circuit_id: str
    name: str
    rung: int
    intensity_range: Range | None
    members: tuple[Member, ...]
    fallback: ClusterDoc | None


def _where(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidParameter(f"{param or 'the document'} must be a JSON object", param=param or "body")
    return value


def _text(doc: dict[str, Any], key: str, prefix: str, pattern: re.Pattern[str] | None = None) -> str:
    value = doc.get(key)
    param = _where(prefix, key)
    if not isinstance(value, str) or not value or len(value) > 200:
        raise InvalidParameter(f"{param} must be a string of 1-200 characters", param=param)
    if pattern is not None and not pattern.match(value):
        raise InvalidParameter(
            f"{param} {value!r} must be letters, digits and . _ ~ - (starting with a letter or digit)", param=param
        )
    return value


def _format(doc: dict[str, Any], expected: str, prefix: str) -> None:
    if doc.get("format") != expected:
        param = _where(prefix, "format")
        raise InvalidParameter(f"{param} must be {expected!r}, not {doc.get('format')!r}", param=param)


def _range(doc: dict[str, Any], prefix: str) -> Range | None:
    value = doc.get("intensity_range")
    if value is None:
        return None
    param = _where(prefix, "intensity_range")
    if (
        not isinstance(value, list)
        or len(value) != 2
        or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in value)
        or not 0 <= value[0] <= value[1]
    ):
        raise InvalidParameter(f"{param} must be [low, high] with 0 <= low <= high", param=param)
    return (float(value[0]), float(value[1]))


def _features(doc: dict[str, Any], prefix: str) -> Features:
    param = _where(prefix, "features")
    features = parse_features(doc.get("features"), param, strict_keys=False)
    if not features:
        raise InvalidParameter(f"{param} must list at least one feature", param=param)
    return features


def read_cluster(doc: Any, prefix: str = "") -> ClusterDoc:
    """A ``mi.cluster/v1`` document, checked (400 naming the field)."""
    doc = _object(doc, prefix)
    _format(doc, CLUSTER_FORMAT, prefix)
    return ClusterDoc(
        cluster_id=_text(doc, "cluster_id", prefix, DOCUMENT_ID),
        name=_text(doc, "name", prefix),
        sae_id=_text(doc, "sae_id", prefix),
        layer=non_negative_int(doc.get("layer"), _where(prefix, "layer")),
        features=_features(doc, prefix),
        intensity_range=_range(doc, prefix),
    )


def read_circuit(doc: Any) -> CircuitDoc:
    """A ``mi.circuit/v1`` document, checked (400 naming the field). Member SAEs need not be registered yet."""
    doc = _object(doc, "")
    _format(doc, CIRCUIT_FORMAT, "")
    rung = doc.get("rung")
    if not isinstance(rung, int) or isinstance(rung, bool) or rung not in RUNG_LANGUAGE:
        raise InvalidParameter(f"rung must be an integer from 0 to 3, not {rung!r}", param="rung")
    members = doc.get("members")
    if not isinstance(members, list) or not members:
        raise InvalidParameter("members must be a non-empty list", param="members")
    read: list[Member] = []
    for j, raw in enumerate(members):
        prefix = f"members[{j}]"
        raw = _object(raw, prefix)
        member = Member(
            _text(raw, "sae_id", prefix), non_negative_int(raw.get("layer"), f"{prefix}.layer"), _features(raw, prefix)
        )
        if any(m.key == member.key for m in read):
            raise InvalidParameter(
                f"{prefix} repeats SAE {member.sae_id!r} at layer {member.layer}", param=f"{prefix}.layer"
            )
        read.append(member)
    fallback = None
    if doc.get("slice_fallback") is not None:
        holder = _object(doc["slice_fallback"], "slice_fallback")
        fallback = read_cluster(holder.get("cluster"), "slice_fallback.cluster")
    return CircuitDoc(
        circuit_id=_text(doc, "circuit_id", "", DOCUMENT_ID),
        name=_text(doc, "name", ""),
        rung=int(rung),
        intensity_range=_range(doc, ""),
        members=tuple(read),
        fallback=fallback,
    )
