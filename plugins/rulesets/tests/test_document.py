"""mi.ruleset/v1: parsing, the refusals in their documented order, and the semantics of each signal."""

from __future__ import annotations

import copy
import time

import pytest

from millm_rulesets.document import parse
from millm_rulesets.errors import (
    CodeRuleInWithinN,
    CodeRulePositionsNeeded,
    InvalidRuleSet,
    PatternRefused,
)
from millm_rulesets.evaluate import case_failures, evaluate
from millm_rulesets.validators import length_prefix_table, luhn, mod97

CODE = {"kind": "code_rule", "wat": "(module)"}


def test_the_pii_set_proves_its_cases(docs):
    assert case_failures(parse(docs.PII)) == []


def test_validators(docs):
    CARD, BAD_CARD, IBAN, BAD_IBAN = docs.CARD, docs.BAD_CARD, docs.IBAN, docs.BAD_IBAN
    assert luhn(CARD, {}) and not luhn(BAD_CARD, {}) and not luhn("4111x1111", {})
    assert mod97(IBAN, {}) and not mod97(BAD_IBAN, {}) and not mod97("DE", {})
    table = {"table": {"DE": 22, "FR": 27}}
    assert length_prefix_table(IBAN, table) and not length_prefix_table("DE89 3704", table)
    assert not length_prefix_table("GB29 NWBK 6016 1331 9268 19", table)


@pytest.mark.parametrize(
    "pattern",
    [r"(a)\1", r"(?=a)b", r"(?!a)b", r"(?<=a)b", r"(?<!a)b", "(unclosed"],
)
def test_patterns_re2_refuses_are_refused_with_their_pointer(docs, pattern):
    doc = docs.pii()
    doc["signals"]["email"]["pattern"] = pattern
    with pytest.raises(PatternRefused) as refused:
        parse(doc)
    assert refused.value.param == "/signals/email/pattern"
    assert "email" in refused.value.message


def test_a_pointer_escapes_slash_and_tilde(docs):
    doc = docs.pii()
    doc["signals"]["a~c"] = {"kind": "pattern", "pattern": "(?=x)"}
    with pytest.raises(PatternRefused) as refused:
        parse(doc)
    assert refused.value.param == "/signals/a~0c/pattern"
    doc = docs.pii()  # a name may not hold '/' (it is no path); a word of a word list may
    doc["signals"]["threat"]["words"]["and/or~"] = "heavy"
    with pytest.raises(InvalidRuleSet) as refused:
        parse(doc)
    assert refused.value.param == "/signals/threat/words/and~1or~0"


def test_catastrophic_backtracking_is_linear():
    doc = {
        "format": "mi.ruleset/v1",
        "ruleset_id": "x",
        "version": "1",
        "signals": {"evil": {"kind": "pattern", "pattern": "(a+)+$"}},
        "expressions": {"e": "evil"},
    }
    rs = parse(doc)
    text = "a" * 50_000 + "!"
    started = time.perf_counter()
    assert evaluate(rs, text)["e"].fires is False
    assert time.perf_counter() - started < 5  # Python's re would take longer than the universe has


@pytest.mark.parametrize(
    ("change", "error", "param"),
    [
        ({"format": "mi.ruleset/v2"}, InvalidRuleSet, "/format"),
        ({"ruleset_id": ""}, InvalidRuleSet, "/ruleset_id"),
        ({"signals": {}}, InvalidRuleSet, "/signals"),
        ({"signals": {"x": {"kind": "nope"}}}, InvalidRuleSet, "/signals/x/kind"),
        ({"expressions": {"e": {"any": ["missing"]}}}, InvalidRuleSet, "/expressions/e"),
        ({"expressions": {"e": {"all": ["f"]}, "f": {"not": "e"}}}, InvalidRuleSet, "/expressions/e"),
        ({"vetoes": [{"when": "nothing", "removes": []}]}, InvalidRuleSet, "/vetoes/0/when"),
        ({"outputs": [{"column": "c", "use": "bogus", "of": "pii"}]}, InvalidRuleSet, "/outputs/0/use"),
        ({"cases": [{"text": "x", "expect": {"nothing": True}}]}, InvalidRuleSet, "/cases/0/expect/nothing"),
    ],
)
def test_shape_refusals_name_what_failed(docs, change, error, param):
    doc = docs.pii(**change)
    if "signals" in change and change["signals"] and "x" in change["signals"]:
        doc["expressions"], doc["vetoes"], doc["outputs"], doc["cases"] = {}, [], [], []
    with pytest.raises(error) as refused:
        parse(doc)
    assert refused.value.param == param


def _with_code(docs, **extra):
    doc = docs.pii()
    doc["signals"]["custom"] = copy.deepcopy(CODE)
    for key, value in extra.items():
        if key == "signals":
            doc["signals"].update(value)
        elif key == "expressions":
            doc["expressions"].update(value)
        else:
            doc[key] = value
            if key == "outputs":  # the cases' dataset rows name the columns replaced
                for case in doc["cases"]:
                    case.pop("outputs", None)
    return doc


def test_code_rule_in_within_n_names_the_expression(docs):
    doc = _with_code(docs, expressions={"near_code": {"within_n": {"a": "card", "b": "custom", "n": 5}}})
    with pytest.raises(CodeRuleInWithinN) as refused:
        parse(doc)
    assert refused.value.param == "/expressions/near_code"
    assert refused.value.extra == {"expression": "near_code"}


def test_code_rule_through_an_expression_in_within_n_is_refused_too(docs):
    doc = _with_code(
        docs,
        expressions={
            "either": {"any": ["card", "custom"]},
            "near": {"within_n": {"a": "either", "b": "email", "n": 5}},
        },
    )
    with pytest.raises(CodeRuleInWithinN):
        parse(doc)


@pytest.mark.parametrize(
    ("extra", "param", "use"),
    [
        (
            {"signals": {"p": {"kind": "proximity", "anchor": "custom", "cues": ["x"], "within_chars": 3}}},
            "/signals/p/anchor",
            "anchor",
        ),
        (
            {"signals": {"v": {"kind": "validator", "validator": "luhn", "span_of": "custom"}}},
            "/signals/v/span_of",
            "span_of",
        ),
        ({"vetoes": [{"when": "custom", "removes": []}]}, "/vetoes/0/when", "veto_when"),
        ({"vetoes": [{"when": "card", "removes": ["email", "custom"]}]}, "/vetoes/0/removes/1", "veto_removes"),
        ({"outputs": [{"column": "code_text", "use": "field", "of": "custom"}]}, "/outputs/0", "field"),
    ],
)
def test_code_rule_positions_needed(docs, extra, param, use):
    with pytest.raises(CodeRulePositionsNeeded) as refused:
        parse(_with_code(docs, **extra))
    assert refused.value.param == param
    assert refused.value.extra["use"] == use


def test_refusals_come_in_the_documented_order(docs):
    """within_n first, then anchors/span_of, then vetoes, then field outputs; counting a code rule is accepted."""
    everything = {
        "expressions": {"near_code": {"within_n": {"a": "card", "b": "custom", "n": 5}}},
        "signals": {"v": {"kind": "validator", "validator": "luhn", "span_of": "custom"}},
        "vetoes": [{"when": "custom", "removes": []}],
        "outputs": [{"column": "code_text", "use": "field", "of": "custom"}],
    }
    order = [
        (CodeRuleInWithinN, "expressions"),
        (CodeRulePositionsNeeded, "signals"),
        (CodeRulePositionsNeeded, "vetoes"),
        (CodeRulePositionsNeeded, "outputs"),
    ]
    remaining = dict(everything)
    for error, key in order:
        with pytest.raises(error) as refused:
            parse(_with_code(docs, **remaining))
        assert refused.value.param.startswith(f"/{key}/")
        remaining.pop(key)
    counted = parse(
        _with_code(
            docs, expressions={"c": {"any": ["custom"]}}, outputs=[{"column": "n", "use": "count", "of": "custom"}]
        )
    )
    assert counted.signals["custom"].kind == "code_rule"


def test_semantics(docs):
    rs = parse(docs.PII)
    text = f"card {docs.CARD} and mail me at a@b.example. kill kill"
    got = evaluate(rs, text)
    assert got["pii"].fires and got["pii"].count == 2
    assert got["card_and_email"].fires and got["card_and_email"].count == 1
    assert got["threat_words"].fires and got["threat_words"].count == 2  # kill + kill weigh 4 >= 3
    assert got["no_threat"].fires is False and got["no_threat"].count == 0
    quiet = evaluate(rs, "kill time")  # weighs 2 < 3: no fire, so no count either
    assert quiet["threat_words"].count == 0 and quiet["no_threat"].fires and quiet["no_threat"].count == 1


def test_a_long_chain_of_references_is_refused_not_a_crash(docs):
    doc = docs.pii(cases=[], vetoes=[], outputs=[])
    doc["expressions"] = {f"e{i}": {"not": f"e{i + 1}"} for i in range(300)}
    doc["expressions"]["e300"] = "card"
    with pytest.raises(InvalidRuleSet) as refused:
        parse(doc)
    assert refused.value.param == "/expressions"
    doc["expressions"] = {f"e{i}": {"not": f"e{i + 1}"} for i in range(150)}
    doc["expressions"]["e150"] = "card"
    assert evaluate(parse(doc), "nothing")["e0"].fires is False  # 150 nots over a silent card


# --- vetoes and outputs: the set as a dataset reads it ---------------------------------------


def _dataset(rs, text):
    from millm_rulesets.evaluate import Run, Vetoed, dataset_row

    vetoed = Vetoed(Run(rs, text))
    return vetoed, dataset_row(vetoed)


def test_a_veto_removes_the_spans_its_when_overlaps_and_what_reads_them_follows(docs):
    rs = parse(docs.PII)
    text = f"cards {docs.CARD} and {docs.REAL_CARD}, mail a@b.example"
    served = evaluate(rs, text)
    assert served["pii"].count == 3  # served results: the veto is not applied
    vetoed, row = _dataset(rs, text)
    assert vetoed.fired == [True] and vetoed.removed() == {"card": 1}
    assert vetoed.get("card").count == 1 and vetoed.get("card_ok").count == 1  # the validator checks what is left
    assert vetoed.get("pii").count == 2 and vetoed.get("card_and_email").fires is True  # REAL_CARD near the mail
    assert row == {"has_pii": True, "pii_count": 2, "cards": [docs.REAL_CARD], "email_text": ["a@b.example"]}
    # a veto whose when does not fire removes nothing
    vetoed, row = _dataset(rs, f"card {docs.REAL_CARD}")
    assert vetoed.fired == [False] and vetoed.removed() == {} and row["cards"] == [docs.REAL_CARD]


def test_a_vetoed_word_list_must_still_weigh_enough(docs):
    doc = docs.pii(
        signals={
            **docs.PII["signals"],
            "quoted": {"kind": "pattern", "pattern": r'"[^"]*"'},
            "threat": {"kind": "wordlist", "words": {"kill": 2.0, "bomb": 3.0}, "min_weight": 3.0},
        },
        vetoes=[{"when": "quoted", "removes": ["threat"]}],
        outputs=[{"column": "threat", "use": "count", "of": "threat_words"}],
        cases=[
            {"text": 'the film "bomb" and kill', "expect": {"threat_words": 2}, "outputs": {"threat": 0}},
            {"text": '"kill" bomb', "expect": {"threat_words": 2}, "outputs": {"threat": 1}},
        ],
    )
    rs = parse(doc)
    assert case_failures(rs) == []  # kill alone weighs 2 < 3: no fire; bomb alone weighs 3


def test_a_case_whose_dataset_row_disagrees_fails_naming_the_column(docs):
    doc = docs.pii()
    doc["cases"][0]["outputs"]["has_pii"] = True  # the veto removes the test card: the row says False
    assert case_failures(parse(doc)) == [
        {"case": 0, "output": "has_pii", "expected": {"value": True}, "got": {"value": False}}
    ]


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"vetoes": [{"when": "no_threat", "removes": ["card"]}]}, "/vetoes/0/when"),  # a not has no spans
        ({"vetoes": [{"when": "card", "removes": ["no_threat"]}]}, "/vetoes/0/removes/0"),
        ({"outputs": [{"column": "c", "use": "field", "of": "no_threat"}]}, "/outputs/0"),
        (
            {
                "outputs": [{"column": "c", "use": "fired", "of": "pii"}],
                "cases": [{"text": "x", "expect": {}, "outputs": {"nope": True}}],
            },
            "/cases/0/outputs/nope",
        ),
        (
            {
                "outputs": [{"column": "c", "use": "fired", "of": "pii"}],
                "cases": [{"text": "x", "expect": {}, "outputs": {"c": 1}}],
            },
            "/cases/0/outputs/c",
        ),
        (
            {
                "outputs": [{"column": "c", "use": "field", "of": "pii"}],
                "cases": [{"text": "x", "expect": {}, "outputs": {"c": "text"}}],
            },
            "/cases/0/outputs/c",
        ),
    ],
)
def test_what_vetoes_and_outputs_read_must_have_spans_and_case_rows_their_types(docs, change, param):
    doc = docs.pii(**change)
    if "outputs" in change and "cases" not in change:
        for case in doc["cases"]:
            case.pop("outputs", None)
    with pytest.raises(InvalidRuleSet) as refused:
        parse(doc)
    assert refused.value.param == param
