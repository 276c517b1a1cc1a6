"""The steering_intensity dial: validation and λ resolution (the cluster rule, no declared range)."""

from __future__ import annotations

import pytest

from millm_host.api import InvalidParameter
from millm_steering.intensity import Dial, parse_dial, resolve


@pytest.mark.parametrize("value", [2.5, -0.1, "high", "0.5", True, False, [1], {"x": 1}])
def test_invalid_dials_are_refused(value):
    with pytest.raises(InvalidParameter) as err:
        parse_dial(value)
    assert err.value.param == "steering_intensity"
    assert err.value.code == "invalid_parameter"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, 1.0),
        (0, 0.0),
        ("off", 0.0),
        (0.25, 0.25),
        (1, 1.0),
        (2, 1.5),
        ("min", 0.5),
        ("max", 1.5),
    ],
)
def test_resolution(value, expected):
    assert resolve(parse_dial(value), 0.5, 1.5) == expected


def test_below_the_floor_is_honoured_and_bounds_meet_the_envelope():
    assert resolve(Dial(number=0.1), 0.5, 2.0) == 0.1
    assert resolve(Dial(symbol="max"), 0.5, 7.0) == 2.0
    assert resolve(Dial(symbol="min"), -1.0, 2.0) == 0.0
