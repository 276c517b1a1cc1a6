"""X-miLLM-Steering: the grammar, member order, parameters and percent-encoded names."""

from __future__ import annotations

from types import SimpleNamespace

import http_sfv

from millm_host.api import parse_list, percent_encode
from millm_steering.hashing import applied_set
from millm_steering.header import intensity_value, steering_value, unknown_value
from millm_steering.resolve import Entry
from millm_steering.state import Attachment


def attachment(sae_id, layer):
    return Attachment(SimpleNamespace(sae_id=sae_id), layer, "resid_post")


def parse(value):
    return [(str(m.value), dict(m.params)) for m in parse_list(value)]


def test_none_and_unknown():
    assert steering_value([], False) == "none"
    assert steering_value([], True) == "none;changed"
    assert unknown_value("claims_unreadable") == "unknown;reason=claims_unreadable"
    assert unknown_value("read_failed", True) == "unknown;reason=read_failed;changed"


def test_inline_member_is_the_spec_example():
    entry = Entry("inline", attachment("LiquidAI--LFM2.5-1.2B-Instruct-sae--layer_11", 11), applied_set([(1234, 8.0)]))
    assert steering_value([entry], False) == (
        'inline;sae="LiquidAI--LFM2.5-1.2B-Instruct-sae--layer_11";layer=11;features=1;'
        'hash="sha256:a4eae730e5105f422b93abeece7e03bda3c29b096c07aa9cee6f247e12844105"'
    )


def test_members_in_order_with_their_parameters_in_order():
    profile = Entry(
        "profile",
        attachment("b-sae", 11),
        applied_set([(1, 300.0), (2, 0.0), (3, -1.0)], 1.5),
        name='humör "x" 100%',
        source="active",
        intensity=1.5,
    )
    manual_low = Entry("manual", attachment("z-sae", 2), applied_set([(9, 250.0)]))
    manual_same_layer = Entry("manual", attachment("a-sae", 11), applied_set([(4, 1.0)]))
    value = steering_value([profile, manual_low, manual_same_layer], True)
    members = parse(value)
    assert [(kind, params["sae"], params["layer"]) for kind, params in members] == [
        ("manual", "z-sae", 2),
        ("manual", "a-sae", 11),
        ("profile", "b-sae", 11),
    ]
    kind, params = members[2]
    assert list(params) == ["name", "source", "intensity", "sae", "layer", "features", "hash", "clamped", "changed"]
    assert params["name"] == "hum%C3%B6r %22x%22 100%25"
    assert str(params["source"]) == "active" and isinstance(params["source"], http_sfv.Token)
    assert params["intensity"] == "1.5" and params["features"] == 2 and params["clamped"] == 1
    assert params["changed"] is True and value.count(";changed") == 3 and "changed=?1" not in value
    assert "clamped" not in parse(value)[0][1]  # manual carries no clamped parameter


def test_percent_encoding():
    assert percent_encode("plain name-1") == "plain name-1"
    assert percent_encode('a"b\\c%d\n') == "a%22b%5Cc%25d%0A"
    assert percent_encode("日") == "%E6%97%A5"


def test_intensity_is_a_string_of_the_shortest_round_trip():
    assert intensity_value(0.1) == '"0.1"'
    assert intensity_value(1) == '"1.0"'
    assert intensity_value(1 / 3) == '"0.3333333333333333"'
