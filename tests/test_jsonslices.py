"""``loads_in_slices`` is ``json.loads``: the same value for valid text, an error for invalid text.

Run with a tiny slice so that every code path (whole values, runs of members,
member by member, strings cut between escapes) is taken on small documents.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from millm_host.bodies import parse as jsonslices

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=40,
)


@pytest.fixture(autouse=True)
def tiny_slices(monkeypatch):
    monkeypatch.setattr(jsonslices, "SLICE", 16)


def parse(text: str):
    return jsonslices.loads_in_slices(text, json.JSONDecoder(), max_depth=1000)


@settings(max_examples=100, deadline=None)
@given(value=JSON, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 1]))
def test_valid_text_gives_what_json_loads_gives(value, ascii_only, indent):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert parse(text) == json.loads(text)


@settings(max_examples=100, deadline=None)
@given(value=JSON, cut=st.integers(min_value=0), junk=st.sampled_from(["", ",", "]", "}", '"', "\\", "x", " 1"]))
def test_broken_text_is_refused_as_json_loads_refuses_it(value, cut, junk):
    text = json.dumps(value)
    broken = text[: cut % (len(text) + 1)] + junk
    try:
        expected = json.loads(broken)
    except json.JSONDecodeError:
        with pytest.raises((json.JSONDecodeError, jsonslices.TooDeep)):
            parse(broken)
    else:
        assert parse(broken) == expected


def count_containers(value) -> int:
    if isinstance(value, dict):
        return 1 + sum(count_containers(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(count_containers(v) for v in value)
    return 0


@settings(max_examples=100, deadline=None)
@given(value=JSON, most=st.integers(min_value=0, max_value=40), brackets_in_strings=st.booleans())
def test_containers_past_the_bound_are_refused_and_no_others(value, most, brackets_in_strings):
    """Exactly the texts of more than ``max_containers`` objects and arrays are refused (brackets in strings are text)."""
    if brackets_in_strings:
        value = [value, "[{" * 20, {"[": "]{"}]
    text = json.dumps(value)
    if count_containers(value) > most:
        with pytest.raises(jsonslices.TooManyContainers):
            jsonslices.loads_in_slices(text, json.JSONDecoder(), max_depth=1000, max_containers=most)
    else:
        assert jsonslices.loads_in_slices(text, json.JSONDecoder(), max_depth=1000, max_containers=most) == json.loads(
            text
        )


class OutOfRange(ValueError):
    pass


def _bounded(text: str) -> int:
    if abs(value := int(text)) > 2**63:
        raise OutOfRange(text)
    return value


@settings(max_examples=100, deadline=None)
@given(ints=st.lists(st.integers(min_value=-(10**22), max_value=10**22), min_size=1, max_size=40), floats=st.booleans())
def test_runs_without_long_integers_give_what_the_hooked_decoder_gives(ints, floats):
    """``short_ints`` (the decoder less its parse_int hook) scans only runs whose integers are short."""
    text = json.dumps({"x": [*ints, 1.5e300] if floats else ints})
    hooked = json.JSONDecoder(parse_int=_bounded)
    plain = json.JSONDecoder()
    if any(abs(i) > 2**63 for i in ints):
        with pytest.raises(OutOfRange):
            jsonslices.loads_in_slices(text, hooked, max_depth=10, short_ints=plain)
    else:
        assert jsonslices.loads_in_slices(text, hooked, max_depth=10, short_ints=plain) == json.loads(text)


@settings(max_examples=75, deadline=None)
@given(value=JSON)
def test_long_lists_are_reported_and_plain_is_never_wrongly_true(value):
    """``long_list`` sees each long array once parsed; ``plain`` (no object or array inside) is never wrong
    when true: the caller takes such a list out of the collector's sight."""
    reported: list[tuple[list, bool]] = []
    text = json.dumps(value)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonslices, "LONG_LIST", 2)
        parsed = jsonslices.loads_in_slices(
            text, json.JSONDecoder(), max_depth=1000, long_list=lambda items, plain: reported.append((items, plain))
        )
    assert parsed == json.loads(text)
    for items, plain in reported:
        assert len(items) >= 2
        if plain:
            assert not any(isinstance(item, (list, dict)) for item in items)


def test_a_long_list_of_scalars_is_reported_plain(monkeypatch):
    monkeypatch.setattr(jsonslices, "LONG_LIST", 40)
    reported: list[bool] = []
    jsonslices.loads_in_slices(
        json.dumps({"ids": list(range(50)), "nests": [[i] for i in range(50)]}),
        json.JSONDecoder(),
        max_depth=10,
        long_list=lambda items, plain: reported.append(plain),
    )
    assert sorted(reported) == [False, True]


def test_a_refused_parse_leaves_its_partial_lists_empty(monkeypatch):
    """What was parsed of a refused body is freed as the parser unwinds, a slice at a time (1.4M objects
    freed at once, by whoever dropped the exception, held the GIL for 12 ms): no frame of the
    exception's traceback still holds a filled list."""
    text = json.dumps({"x": [[i] for i in range(200)]})
    with pytest.raises(jsonslices.TooManyContainers) as refused:
        jsonslices.loads_in_slices(text, json.JSONDecoder(), max_depth=10, max_containers=150)
    tb = refused.value.__traceback__
    held = []
    while tb is not None:
        held += [v for v in tb.tb_frame.f_locals.values() if isinstance(v, list) and len(v) > 8]
        tb = tb.tb_next
    assert held == []


KEYS = st.sampled_from(["custom_id", "body", "x", 'c"q', "é"])


@settings(max_examples=100, deadline=None)
@given(
    value=st.dictionaries(KEYS, JSON, max_size=6),
    ascii_only=st.booleans(),
    indent=st.sampled_from([None, 0, 1]),
)
def test_top_level_strings_are_the_string_members_json_loads_gives(value, ascii_only, indent):
    """What a refused batch line can still say (its custom_id after its body): the object's own string
    members, never a nested one, whatever the strings and brackets around them hold."""
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    keys = frozenset(["custom_id", 'c"q', "é"])
    expected = {k: v for k, v in json.loads(text).items() if k in keys and isinstance(v, str)}
    assert jsonslices.top_level_strings(text, keys) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"a":"' + '\\"' * 2_000_000,  # one unterminated string of escaped quotes
        '{"a":[' + "[]" * 2_000_000 + '], "custom_id": "late"}',  # brackets to walk
        "{" + '"",' * 1_300_000 + '"custom_id": "late"}',  # strings to hop
        '{"a":"' + "\\" * 4_000_000 + '"',
    ],
)
def test_top_level_strings_give_up_within_a_bound_of_steps(text):
    """Its Python-speed steps are bounded (``TOP_LEVEL_STEPS``): past them it gives up with what it found."""
    assert jsonslices.top_level_strings(text, frozenset(["custom_id"])) == {}
