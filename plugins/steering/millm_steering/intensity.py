"""The per-request intensity dial (``steering_intensity``) and how it resolves to λ.

A dial is a number in the envelope [0, 2] or one of ``"off"``, ``"min"``, ``"max"``.
It scales the steering base (the request's profile, else the active profile,
else the live values) and every active circuit.

- The cluster rule (profiles, clusters, live values, a circuit's slice fallback):
  ``min``/``max`` are the declared ``intensity_range`` (else ``CLUSTER_INTENSITY_MIN``
  / ``CLUSTER_INTENSITY_MAX``) intersected with the envelope; a number is capped at
  the ceiling and honoured below the floor. Without a request dial a cluster's
  stored dial applies (a plain profile's λ is 1).
- The circuit rule: the same bounds (``CIRCUIT_INTENSITY_MIN`` / ``_MAX`` without a
  range), but a number or the stored dial is clamped at both ends.

Under both, exactly 0 / ``off`` turns steering off.
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


@dataclass(frozen=True)
class Limits:
    """The server's bounds for bases and circuits that declare no ``intensity_range``."""

    cluster_min: float = 0.5
    cluster_max: float = 2.0
    circuit_min: float = 0.0
    circuit_max: float = 2.0

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(
            settings["CLUSTER_INTENSITY_MIN"],
            settings["CLUSTER_INTENSITY_MAX"],
            settings["CIRCUIT_INTENSITY_MIN"],
            settings["CIRCUIT_INTENSITY_MAX"],
        )


def bounds(declared: tuple[float, float] | None, floor: float, ceiling: float) -> tuple[float, float]:
    """``[low, high]``: the declared range (else the server's), intersected with the envelope."""
    low, high = declared if declared is not None else (floor, ceiling)
    clip = lambda x: min(max(x, ENVELOPE[0]), ENVELOPE[1])  # noqa: E731
    return clip(low), clip(high)


def cluster_lam(dial: Dial | None, declared: tuple[float, float] | None, stored: float, limits: Limits) -> float:
    """λ under the cluster rule: the request's dial overrides the stored one (capped, floor honoured)."""
    low, high = bounds(declared, limits.cluster_min, limits.cluster_max)
    if dial is None:
        return min(stored, high)
    return resolve(dial, low, high)


def circuit_lam(dial: Dial | None, declared: tuple[float, float] | None, stored: float, limits: Limits) -> float:
    """λ under the circuit rule: both ends clamped; only an exact 0 / ``off`` goes below the floor."""
    low, high = bounds(declared, limits.circuit_min, limits.circuit_max)
    if dial is None:
        return 0.0 if stored == 0.0 else min(max(stored, low), high)
    if dial.is_off:
        return 0.0
    if dial.symbol is not None:
        return resolve(dial, low, high)
    assert dial.number is not None
    return min(max(dial.number, low), high)


@dataclass(frozen=True)
class Dialing:
    """A request's dial with the server's limits: λ for each kind of base."""

    dial: Dial | None
    limits: Limits

    def plain(self) -> float:
        """Live values and plain profiles: no declared range, stored λ 1."""
        return cluster_lam(self.dial, None, 1.0, self.limits)

    def cluster(self, declared: tuple[float, float] | None, stored: float) -> float:
        return cluster_lam(self.dial, declared, stored, self.limits)

    def circuit(self, declared: tuple[float, float] | None, stored: float) -> float:
        return circuit_lam(self.dial, declared, stored, self.limits)
