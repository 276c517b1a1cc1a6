"""The per-request intensity dial (``steering_intensity``) and how it resolves to λ.

A dial is a number in the envelope [0, 2] or one of ``"off"``, ``"min"``, ``"max"``.
It scales the steering base (the request's profile, else the active profile,
else the live values). A base declares no intensity range here, so the cluster
rule applies with the server's bounds: ``min`` is ``CLUSTER_INTENSITY_MIN``,
``max`` and the cap of a numeric λ are ``CLUSTER_INTENSITY_MAX`` (each intersected
with the envelope); a λ below the floor is honoured, and 0 / ``off`` turns
steering off for the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from millm_host.api import InvalidParameter

ENVELOPE = (0.0, 2.0)
SYMBOLS = ("off", "min", "max")
PARAM = "steering_intensity"


@dataclass(frozen=True)
class Dial:
    """A validated dial: a symbol, or a number within the envelope."""

    symbol: str | None = None
    number: float | None = None

    @property
    def is_off(self) -> bool:
        return self.symbol == "off" or self.number == 0.0


def parse_dial(value: Any) -> Dial | None:
    """The dial a request sent (None when absent or null); 400 ``invalid_parameter`` otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        if value in SYMBOLS:
            return Dial(symbol=value)
        raise InvalidParameter(
            f"steering_intensity {value!r} is not one of {', '.join(SYMBOLS)} or a number from 0 to 2",
            param=PARAM,
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidParameter("steering_intensity must be a number from 0 to 2 or off/min/max", param=PARAM)
    number = float(value)
    if not ENVELOPE[0] <= number <= ENVELOPE[1]:
        raise InvalidParameter(f"steering_intensity {value} is outside 0-2", param=PARAM)
    return Dial(number=number)


def resolve(dial: Dial | None, floor: float, ceiling: float) -> float:
    """λ for ``dial`` against a base bounded by ``[floor, ceiling]`` (no dial: 1.0).

    ``min`` and ``max`` give the bounds (intersected with the envelope); a number is
    capped at the ceiling and honoured below the floor; ``off`` and 0 give 0.
    """
    if dial is None:
        return 1.0
    low = min(max(floor, ENVELOPE[0]), ENVELOPE[1])
    high = min(max(ceiling, ENVELOPE[0]), ENVELOPE[1])
    if dial.is_off:
        return 0.0
    if dial.symbol == "min":
        return low
    if dial.symbol == "max":
        return high
    assert dial.number is not None
    return min(dial.number, high)
