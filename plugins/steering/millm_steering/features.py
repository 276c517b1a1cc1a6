"""Feature lists ``[{"index", "strength"}]`` as requests and the management API send them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeGuard

from millm_host.api import InvalidParameter

from .errors import InvalidFeatureIndex

Features = tuple[tuple[int, float], ...]


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def non_negative_int(value: Any, param: str) -> int:
    """``value`` if it is an integer >= 0 (booleans and None refused); else 400 naming ``param``."""
    if not is_int(value) or value < 0:
        raise InvalidParameter(f"{param} must be a non-negative integer, not {value!r}", param=param)
    return value


def parse_features(value: Any, param: str, *, strict_keys: bool, max_abs: float | None = None) -> Features:
    """``((index, strength), ...)`` in the order sent; 400 naming the first bad entry.

    Indices are non-negative integers listed once; strengths finite numbers
    (booleans refused), within ``±max_abs`` when given. ``strict_keys`` refuses
    keys other than ``index`` and ``strength`` (the management API; requests
    report them in ``X-miLLM-Ignored-Fields`` instead).
    """
    if not isinstance(value, list):
        raise InvalidParameter(f"{param} must be a list of {{index, strength}} objects", param=param)
    seen: dict[int, int] = {}
    parsed: list[tuple[int, float]] = []
    for j, item in enumerate(value):
        where = f"{param}[{j}]"
        if not isinstance(item, dict):
            raise InvalidParameter(f"{where} must be an object with index and strength", param=where)
        if strict_keys:
            extra = sorted(set(item) - {"index", "strength"})
            if extra:
                raise InvalidParameter(f"{where} has unknown keys: {', '.join(extra)}", param=f"{where}.{extra[0]}")
        index = non_negative_int(item.get("index"), f"{where}.index")
        if index in seen:
            raise InvalidParameter(
                f"feature {index} is listed twice ({param}[{seen[index]}] and {where})", param=f"{where}.index"
            )
        strength = item.get("strength")
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength):
            raise InvalidParameter(
                f"{where}.strength must be a finite number, not {strength!r}", param=f"{where}.strength"
            )
        if max_abs is not None and abs(strength) > max_abs:
            raise InvalidParameter(f"{where}.strength {strength} is outside ±{max_abs:g}", param=f"{where}.strength")
        seen[index] = j
        parsed.append((index, float(strength)))
    return tuple(parsed)


def check_indices(indices: Sequence[int], d_sae: int, sae_id: str, param_for: Callable[[int], str]) -> None:
    """400 ``INVALID_FEATURE_INDEX`` for the first index at or past the SAE's width.

    ``param_for(j)`` names the j-th index in the request (``steering.features[2].index``).
    """
    for j, index in enumerate(indices):
        if index >= d_sae:
            raise InvalidFeatureIndex(
                f"feature index {index} is out of range for SAE {sae_id!r} (d_sae {d_sae}: 0 to {d_sae - 1})",
                param=param_for(j),
            )


def features_json(features: Features) -> list[dict[str, Any]]:
    return [{"index": index, "strength": strength} for index, strength in features]
