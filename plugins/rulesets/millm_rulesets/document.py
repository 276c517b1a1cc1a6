"""``mi.ruleset/v1``: every check a document must pass, in one order, before it is compiled.

The checks run in this order and the first failure is the refusal (``param`` is
the JSON pointer of what failed):

1. shape: ``format`` (``mi.ruleset/v1``, the default when absent), ``ruleset_id``,
   ``version`` and the types of the blocks; the names (``ruleset_id``, ``version``,
   each signal, expression and output column) follow the rules of every name shown
   to operators (``_name``);
2. each signal in document order: its kind and fields; a pattern RE2 refuses
   (back-references, look-around, …) is ``rule_pattern_refused``;
3. each expression: its form, that every operand names a signal or an
   expression, no cycles; then the vetoes and the outputs name what exists;
4. what needs a code rule's positions, in miDataworks' order (suite decisions
   D65, D74): every ``within_n`` expression (``code_rule_in_within_n``), then
   every proximity ``anchor`` and validator ``span_of``, then each veto's
   ``when`` and ``removes``, then each ``field`` output
   (``code_rule_positions_needed``, its ``use``: ``anchor``, ``span_of``,
   ``veto_when``, ``veto_removes`` or ``field``);
   (what a veto or a ``field`` output reads must have positions: a ``not``, or an
   expression over one, is refused there too, naming it);
5. the cases (``rule_set_cases_failed``, naming each disagreement), run by
   ``manage.check``: a case naming what a code rule decides asks the rule runner
   (``code_runner``); operator code itself is loaded only there, never here.

Unknown keys are ignored (a producer may add metadata). Names are shared by
signals and expressions: one name means one thing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import re2

from millm_host.api import InvalidParameter, check_display_name

from .errors import (
    CodeRuleInWithinN,
    CodeRulePositionsNeeded,
    InvalidRuleSet,
    PatternRefused,
    pointer,
)
from .validators import VALIDATORS

FORMAT = "mi.ruleset/v1"
SIGNAL_KINDS = ("pattern", "proximity", "validator", "wordlist", "code_rule")
EXPRESSION_FORMS = ("signal", "all", "any", "not", "within_n")
OUTPUT_USES = ("fired", "count", "field")
MAX_PATTERN_MEMORY = 8 << 20  # bytes RE2 may use per compiled pattern
MAX_NAMES = 200  # signals and expressions together: bounds how deep a chain of references can go


@dataclass(frozen=True)
class Signal:
    name: str
    kind: str
    spec: Mapping[str, Any]
    regex: Any = None  # pattern, proximity cues, word list (compiled by RE2)
    weights: Mapping[str, float] = field(default_factory=dict)  # word list, lower-cased

    @property
    def refs(self) -> tuple[str, ...]:
        """The signals this one reads the spans of."""
        if self.kind == "proximity":
            return (self.spec["anchor"],)
        if self.kind == "validator":
            return (self.spec["span_of"],)
        return ()


@dataclass(frozen=True)
class Expression:
    name: str
    form: str
    operands: tuple[str, ...]
    n: int = 0  # within_n


@dataclass(frozen=True)
class Veto:
    """Where ``when`` matched, the spans of each of ``removes`` that overlap it are removed (datasets only)."""

    when: str
    removes: tuple[str, ...]


@dataclass(frozen=True)
class Output:
    """A dataset column: ``fired`` (bool), ``count`` (int) or ``field`` (the matched texts) of ``of``."""

    column: str
    use: str
    of: str


@dataclass(frozen=True)
class RuleSet:
    """A checked document, compiled: what evaluation runs."""

    ruleset_id: str
    version: str
    signals: dict[str, Signal]
    expressions: dict[str, Expression]  # in document order: the order results are reported in
    cases: list[dict[str, Any]]
    digest: str
    document: dict[str, Any]
    vetoes: tuple[Veto, ...] = ()
    outputs: tuple[Output, ...] = ()

    def has_positions(self, name: str) -> bool:
        if name in self.signals:
            return self.signals[name].kind != "code_rule"
        expr = self.expressions[name]
        if expr.form == "not":
            return False
        if expr.form == "within_n":
            return True
        return all(self.has_positions(op) for op in expr.operands)

    def uses_code(self, name: str) -> bool:
        if name in self.signals:
            return self.signals[name].kind == "code_rule"
        return any(self.uses_code(op) for op in self.expressions[name].operands)


def digest_of(document: Any) -> str:
    data = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(data.encode("utf-8")).hexdigest()


# --- small readers that refuse with a pointer -------------------------------------------


def _refuse(message: str, *where: str | int) -> InvalidRuleSet:
    return InvalidRuleSet(message, param=pointer(*where))


def _string(value: Any, *where: str | int) -> str:
    if not isinstance(value, str) or not value:
        raise _refuse(f"{pointer(*where)} must be a non-empty string", *where)
    return value


def _name(value: str, label: str, *where: str | int) -> str:
    """``value`` if it may name something operators read; else ``invalid_rule_set`` at ``where``.

    The rules profiles, clusters and SAE ids follow: no hidden character (controls,
    bidi and zero-width formatting: ``check_display_name``) and no path (``/``, ``\\``,
    ``.``, ``..``), since names reach logs, headers, the web UI and datasets. The
    message shows the name escaped (``repr``), never as sent.
    """
    param = pointer(*where)
    try:
        check_display_name(value, param)
    except InvalidParameter as exc:
        raise InvalidRuleSet(f"{label} {value!r}: {exc.message}", param=param) from None
    if value in (".", "..") or "/" in value or "\\" in value:
        raise InvalidRuleSet(
            f"{label} {value!r} must be a plain name, not a path (no '/', '\\', '.' or '..')", param=param
        )
    return value


def _object(value: Any, *where: str | int, required: bool = True) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise _refuse(f"{pointer(*where) or 'the document'} must be an object", *where)
    return value


def _list(value: Any, *where: str | int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _refuse(f"{pointer(*where)} must be a list", *where)
    return value


def _int(value: Any, *where: str | int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _refuse(f"{pointer(*where)} must be a non-negative integer", *where)
    return value


def _number(value: Any, *where: str | int) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or abs(value) == float("inf"):
        raise _refuse(f"{pointer(*where)} must be a finite number", *where)
    return float(value)


def compile_pattern(pattern: str, *where: str | int) -> Any:
    """RE2, or ``rule_pattern_refused`` naming the pattern (RE2 has no back-references nor look-around)."""
    options = re2.Options()
    options.log_errors = False
    options.max_mem = MAX_PATTERN_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        detail = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise PatternRefused(
            f"the pattern at {pointer(*where)} is refused: {detail} (patterns are RE2's linear-time dialect: "
            "no back-references, no look-around)",
            param=pointer(*where),
        ) from None


def _phrases_regex(phrases: list[str], *where: str | int) -> Any:
    """Case-insensitive whole-word occurrences of any phrase (longest first)."""
    parts = []
    for phrase in sorted(set(phrases), key=len, reverse=True):
        escaped = re2.escape(phrase)
        head = r"\b" if phrase[0].isalnum() or phrase[0] == "_" else ""
        tail = r"\b" if phrase[-1].isalnum() or phrase[-1] == "_" else ""
        parts.append(f"{head}{escaped}{tail}")
    return compile_pattern("(?i)(?:" + "|".join(parts) + ")", *where)


# --- the checks -------------------------------------------------------------------------


def _signal(name: str, raw: Any) -> Signal:
    where = ("signals", name)
    _name(name, "signal name", "signals")  # the pointer to a bad key would carry it as sent
    spec = _object(raw, *where)
    kind = spec.get("kind")
    if kind not in SIGNAL_KINDS:
        raise _refuse(f"signal {name!r}: kind must be one of {', '.join(SIGNAL_KINDS)}", *where, "kind")
    if kind == "pattern":
        regex = compile_pattern(_string(spec.get("pattern"), *where, "pattern"), *where, "pattern")
        return Signal(name, kind, spec, regex)
    if kind == "proximity":
        _string(spec.get("anchor"), *where, "anchor")
        cues = _list(spec.get("cues"), *where, "cues")
        if not cues:
            raise _refuse(f"signal {name!r}: cues must name at least one phrase", *where, "cues")
        for i, cue in enumerate(cues):
            _string(cue, *where, "cues", i)
        _int(spec.get("within_chars"), *where, "within_chars")
        return Signal(name, kind, spec, _phrases_regex(cues, *where, "cues"))
    if kind == "validator":
        validator = spec.get("validator")
        if validator not in VALIDATORS:
            raise _refuse(f"signal {name!r}: validator must be one of {', '.join(VALIDATORS)}", *where, "validator")
        _string(spec.get("span_of"), *where, "span_of")
        if validator == "length_prefix_table":
            table = _object(spec.get("table"), *where, "table")
            if not table:
                raise _refuse(f"signal {name!r}: table must list at least one prefix", *where, "table")
            for prefix, length in table.items():
                if not prefix:
                    raise _refuse(f"signal {name!r}: a table prefix is empty", *where, "table", prefix)
                _int(length, *where, "table", prefix)
        return Signal(name, kind, spec)
    if kind == "wordlist":
        words = _object(spec.get("words"), *where, "words")
        if not words:
            raise _refuse(f"signal {name!r}: words must list at least one word", *where, "words")
        weights: dict[str, float] = {}
        for word, weight in words.items():
            _string(word.strip(), *where, "words", word)
            weights[word.strip().lower()] = weights.get(word.strip().lower(), 0.0) + _number(
                weight, *where, "words", word
            )
        if "min_weight" in spec:
            _number(spec["min_weight"], *where, "min_weight")
        return Signal(name, kind, spec, _phrases_regex([w.strip() for w in words], *where, "words"), weights)
    # code_rule: its module is the runner's to load; here only its shape is checked
    if not isinstance(spec.get("wat"), str) and not isinstance(spec.get("wasm"), str):
        raise _refuse(f"signal {name!r}: a code_rule carries its module as wat (text) or wasm (base64)", *where)
    return Signal(name, kind, spec)


def _expression(name: str, raw: Any) -> Expression:
    where = ("expressions", name)
    _name(name, "expression name", "expressions")
    if isinstance(raw, str):  # a bare name counts that signal or expression
        return Expression(name, "signal", (raw,))
    spec = _object(raw, *where)
    forms = [f for f in EXPRESSION_FORMS if f in spec]
    if len(forms) != 1:
        raise _refuse(f"expression {name!r} must have exactly one of {', '.join(EXPRESSION_FORMS)}", *where)
    form = forms[0]
    value = spec[form]
    if form in ("signal", "not"):
        return Expression(name, form, (_string(value, *where, form),))
    if form in ("all", "any"):
        operands = _list(value, *where, form)
        if not operands:
            raise _refuse(f"expression {name!r}: {form} needs at least one operand", *where, form)
        return Expression(name, form, tuple(_string(op, *where, form, i) for i, op in enumerate(operands)))
    within = _object(value, *where, "within_n")
    a, b = _string(within.get("a"), *where, "within_n", "a"), _string(within.get("b"), *where, "within_n", "b")
    return Expression(name, form, (a, b), _int(within.get("n"), *where, "within_n", "n"))


def _check_references(signals: dict[str, Signal], expressions: dict[str, Expression]) -> None:
    for name, sig in signals.items():
        for key, ref in zip(("anchor", "span_of"), (sig.spec.get("anchor"), sig.spec.get("span_of")), strict=True):
            if ref is None or sig.kind not in ("proximity", "validator"):
                continue
            if ref not in signals:
                raise _refuse(f"signal {name!r}: {key} {ref!r} names no signal", "signals", name, key)
            if ref == name:
                raise _refuse(f"signal {name!r}: {key} names itself", "signals", name, key)
    for name, expr in expressions.items():
        if name in signals:
            raise _refuse(f"{name!r} names both a signal and an expression", "expressions", name)
        for op in expr.operands:
            if op not in signals and op not in expressions:
                raise _refuse(f"expression {name!r}: {op!r} names no signal or expression", "expressions", name)
    # cycles: a depth-first walk over expressions and the signals they read
    state: dict[str, int] = {}

    def walk(name: str, trail: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise _refuse(f"expressions form a cycle: {' -> '.join((*trail, name))}", "expressions", trail[0])
        state[name] = 1
        operands = expressions[name].operands if name in expressions else signals[name].refs
        for op in operands:
            walk(op, (*trail, name))
        state[name] = 2

    for name in [*signals, *expressions]:
        walk(name, ())


def _check_vetoes_and_outputs(doc: dict[str, Any], known: set[str]) -> None:
    for i, veto in enumerate(_list(doc.get("vetoes"), "vetoes")):
        veto = _object(veto, "vetoes", i)
        when = _string(veto.get("when"), "vetoes", i, "when")
        if when not in known:
            raise _refuse(f"veto {i}: when {when!r} names no signal or expression", "vetoes", i, "when")
        for j, removed in enumerate(_list(veto.get("removes"), "vetoes", i, "removes")):
            if _string(removed, "vetoes", i, "removes", j) not in known:
                raise _refuse(f"veto {i}: removes {removed!r} names nothing", "vetoes", i, "removes", j)
    columns: set[str] = set()
    for i, output in enumerate(_list(doc.get("outputs"), "outputs")):
        output = _object(output, "outputs", i)
        column = _name(_string(output.get("column"), "outputs", i, "column"), "output column", "outputs", i, "column")
        if column in columns:
            raise _refuse(f"output column {column!r} is listed twice", "outputs", i, "column")
        columns.add(column)
        if output.get("use") not in OUTPUT_USES:
            raise _refuse(f"output {column!r}: use must be one of {', '.join(OUTPUT_USES)}", "outputs", i, "use")
        if _string(output.get("of"), "outputs", i, "of") not in known:
            raise _refuse(f"output {column!r}: of {output['of']!r} names nothing", "outputs", i, "of")


def _check_code_rule_positions(rs: RuleSet, doc: dict[str, Any]) -> None:
    """D65/D74: nothing may read where a code rule matched, because it reports a count only."""
    for name, expr in rs.expressions.items():
        if expr.form != "within_n":
            continue
        for op in expr.operands:
            if rs.uses_code(op):
                raise CodeRuleInWithinN(
                    f"expression {name!r}: within_n reads the positions of {op!r}, which is (or reads) a code "
                    "rule; operator code reports a count, never positions",
                    param=pointer("expressions", name),
                    extra={"expression": name},
                )
            if not rs.has_positions(op):
                raise _refuse(f"expression {name!r}: within_n operand {op!r} has no positions", "expressions", name)
    for name, sig in rs.signals.items():
        for key in ("anchor", "span_of"):
            if sig.kind in ("proximity", "validator") and key in sig.spec and rs.uses_code(sig.spec[key]):
                raise CodeRulePositionsNeeded(
                    f"signal {name!r}: its {key} {sig.spec[key]!r} is a code rule, which has no positions",
                    param=pointer("signals", name, key),
                    extra={"signal": name, "use": key},
                )
    for i, veto in enumerate(doc.get("vetoes") or []):
        if rs.uses_code(veto["when"]):
            raise CodeRulePositionsNeeded(
                f"veto {i}: when {veto['when']!r} is (or reads) a code rule; a veto removes matched spans",
                param=pointer("vetoes", i, "when"),
                extra={"veto": i, "use": "veto_when"},
            )
        if not rs.has_positions(veto["when"]):
            raise _refuse(f"veto {i}: when {veto['when']!r} has no spans to veto by", "vetoes", i, "when")
        for j, removed in enumerate(veto.get("removes") or []):
            if rs.uses_code(removed):
                raise CodeRulePositionsNeeded(
                    f"veto {i}: removes {removed!r}, which is (or reads) a code rule and has no spans",
                    param=pointer("vetoes", i, "removes", j),
                    extra={"veto": i, "use": "veto_removes"},
                )
            if not rs.has_positions(removed):
                raise _refuse(f"veto {i}: removes {removed!r}, which has no spans", "vetoes", i, "removes", j)
    for i, output in enumerate(doc.get("outputs") or []):
        if output["use"] == "field" and rs.uses_code(output["of"]):
            raise CodeRulePositionsNeeded(
                f"output column {output['column']!r} reads the matched text of {output['of']!r}, a code rule",
                param=pointer("outputs", i),
                extra={"column": output["column"], "use": "field"},
            )
        if output["use"] == "field" and not rs.has_positions(output["of"]):
            raise _refuse(f"output column {output['column']!r}: {output['of']!r} has no matched text", "outputs", i)


def _check_case_outputs(case: dict[str, Any], i: int, columns: dict[str, str]) -> None:
    """``outputs``: the dataset row a case expects (after the vetoes), by column; each value of its column's type."""
    for column, value in _object(case.get("outputs"), "cases", i, "outputs", required=False).items():
        where = ("cases", i, "outputs", column)
        use = columns.get(column)
        if use is None:
            raise _refuse(f"case {i}: outputs names {column!r}, which is no output column", *where)
        if use == "fired" and not isinstance(value, bool):
            raise _refuse(f"case {i}: output {column!r} is fired: true or false", *where)
        if use == "count":
            _int(value, *where)
        if use == "field" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise _refuse(f"case {i}: output {column!r} is a field: a list of the matched texts", *where)


def _check_cases(doc: dict[str, Any], known: set[str]) -> list[dict[str, Any]]:
    columns = {o["column"]: o["use"] for o in doc.get("outputs") or []}
    cases = _list(doc.get("cases"), "cases")
    for i, case in enumerate(cases):
        case = _object(case, "cases", i)
        if not isinstance(case.get("text"), str):
            raise _refuse(f"case {i}: text must be a string", "cases", i, "text")
        expect = _object(case.get("expect"), "cases", i, "expect")
        for name, value in expect.items():
            if name not in known:
                raise _refuse(f"case {i}: expect names {name!r}, which is nothing", "cases", i, "expect", name)
            if isinstance(value, dict):
                if set(value) - {"fires", "count"} or not value:
                    raise _refuse(f"case {i}: expect {name!r} takes fires and count", "cases", i, "expect", name)
                if "fires" in value and not isinstance(value["fires"], bool):
                    raise _refuse(f"case {i}: fires must be true or false", "cases", i, "expect", name, "fires")
                if "count" in value:
                    _int(value["count"], "cases", i, "expect", name, "count")
            elif not isinstance(value, bool):
                _int(value, "cases", i, "expect", name)
        _check_case_outputs(case, i, columns)
    return cases


def parse(doc: Any) -> RuleSet:
    """Checks 1–4 (the cases are run by ``manage.check``); the compiled set, or the first refusal."""
    doc = _object(doc)
    if doc.get("format", FORMAT) != FORMAT:
        raise _refuse(f"format must be {FORMAT!r}", "format")
    doc = {"format": FORMAT, **doc}  # the default, written in: the digest is the explicit document's
    ruleset_id = _name(_string(doc.get("ruleset_id"), "ruleset_id"), "ruleset_id", "ruleset_id")
    version = doc.get("version")
    if isinstance(version, int) and not isinstance(version, bool):
        version = str(version)
    version = _name(_string(version, "version"), "version", "version")
    # what the rule_sets table holds (SQLite would store more; PostgreSQL refuses it)
    if len(ruleset_id) > 200:
        raise _refuse("ruleset_id has at most 200 characters", "ruleset_id")
    if len(version) > 100:
        raise _refuse("version has at most 100 characters", "version")
    raw_signals = _object(doc.get("signals"), "signals")
    if not raw_signals:
        raise _refuse("signals must name at least one signal", "signals")
    signals = {name: _signal(name, raw) for name, raw in raw_signals.items()}
    raw_expressions = _object(doc.get("expressions"), "expressions", required=False)
    if len(raw_signals) + len(raw_expressions) > MAX_NAMES:
        raise _refuse(f"a rule set names at most {MAX_NAMES} signals and expressions together", "expressions")
    expressions = {name: _expression(name, raw) for name, raw in raw_expressions.items()}
    _check_references(signals, expressions)
    known = set(signals) | set(expressions)
    _check_vetoes_and_outputs(doc, known)
    cases = _check_cases(doc, known)
    vetoes = tuple(Veto(v["when"], tuple(v.get("removes") or ())) for v in doc.get("vetoes") or [])
    outputs = tuple(Output(o["column"], o["use"], o["of"]) for o in doc.get("outputs") or [])
    rs = RuleSet(ruleset_id, version, signals, expressions, cases, digest_of(doc), doc, vetoes, outputs)
    _check_code_rule_positions(rs, doc)
    return rs
