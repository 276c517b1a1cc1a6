"""Running a compiled rule set on one text: each signal once, each expression in document order.

Every signal and expression yields ``fires`` and ``count``; those with positions
also yield their spans (character offsets into the text). Span signals report
spans only when they fire, so ``count > 0`` exactly when ``fires``:

- pattern: its non-empty, non-overlapping RE2 matches;
- validator: the spans of ``span_of`` whose text passes the check;
- proximity: the spans of ``anchor`` with a cue (case-insensitive, whole words)
  at most ``within_chars`` characters away;
- wordlist: the occurrences of its words (case-insensitive, whole words) when
  their summed weight reaches ``min_weight`` (default: any occurrence);
- all / any: fires when all / any operand fires; count sums the firing
  operands' counts, spans are their union;
- not: fires when its operand does not; count 1 when it fires; no spans;
- within_n: each span of ``a`` with a span of ``b`` at most ``n`` characters
  away, reported as the span covering both.

- code_rule: the count operator code returns (the rule runner, through the
  ``code`` callable a run is given); fires when the count is positive; no spans.
  A run without ``code`` (a live request: operator code never delays it), or
  one whose call fails, leaves it ``Undecided`` with the runner's code, and so
  is every expression that reads it.

Vetoes and outputs are for building datasets (spec: they are never applied to the
rule results served beside probes, nor to a case's ``expect``). ``Vetoed`` reads
the set as a dataset does: each veto whose ``when`` fires removes, from each name
in its ``removes``, the spans that overlap a span of ``when``; whatever reads a
cut name is computed again from what is left (a validator checks fewer spans, a
word list weighs fewer words, ``all``/``any``/``within_n`` combine fewer). Every
``when`` is read without vetoes, so the vetoes apply at once and their order does
not matter. ``dataset_row`` then gives each output column: ``fired`` (bool),
``count`` (int) or ``field`` (the matched texts, in order); ``None`` when operator
code did not decide it.

A deadline (``time.perf_counter()`` seconds) bounds a run: an expression not
started before it is reported as out of time (``None``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Required, TypedDict

from .code_runner import UNAVAILABLE, CodeResult
from .document import Output, RuleSet, Signal
from .validators import VALIDATORS

Span = tuple[int, int]
CodeCall = Callable[[Signal, str], CodeResult]  # a code_rule signal and the text -> the runner's answer


@dataclass(frozen=True)
class Outcome:
    fires: bool
    count: int
    spans: tuple[Span, ...] | None  # None: this result has no positions (not)

    @classmethod
    def of_spans(cls, spans: list[Span] | tuple[Span, ...]) -> Outcome:
        ordered = tuple(sorted(set(spans)))
        return cls(bool(ordered), len(ordered), ordered)


NONE = Outcome(False, 0, ())


@dataclass(frozen=True)
class Undecided:
    """No outcome: operator code was not run or failed (``reason`` is the runner's ``rule_*`` code)."""

    reason: str
    detail: str | None = None

    @property
    def skipped(self) -> bool:
        return self.reason == UNAVAILABLE  # no runner result yet: skipped, not failed


Result = Outcome | Undecided


def _gap(a: Span, b: Span) -> int:
    return max(0, b[0] - a[1], a[0] - b[1])


class Nearby:
    """Spans sorted by start, asked for the one nearest a target (a bisect, not a scan of all)."""

    def __init__(self, spans: list[Span] | tuple[Span, ...]) -> None:
        self.spans = sorted(spans)
        self.starts = [s[0] for s in self.spans]
        self.longest = max((e - s for s, e in self.spans), default=0)

    def within(self, target: Span, limit: int) -> Span | None:
        """A span at most ``limit`` characters from ``target`` (the nearest), or None."""
        # every candidate starts in [target.start - limit - longest, target.end + limit]
        lo = bisect.bisect_left(self.starts, target[0] - limit - self.longest)
        hi = bisect.bisect_right(self.starts, target[1] + limit)
        best = min(self.spans[lo:hi], key=lambda s: _gap(s, target), default=None)
        return best if best is not None and _gap(best, target) <= limit else None


class Run:
    """One evaluation: signal and expression outcomes, each computed once."""

    def __init__(self, rs: RuleSet, text: str, code: CodeCall | None = None) -> None:
        self.rs, self.text, self.code = rs, text, code
        self.done: dict[str, Result] = {}

    def get(self, name: str) -> Result:
        if name not in self.done:
            if name in self.rs.signals:
                self.done[name] = self._signal(self.rs.signals[name])
            else:
                self.done[name] = self._expression(name)
        return self.done[name]

    def _matches(self, sig: Signal) -> list[Span]:
        return [m.span() for m in sig.regex.finditer(self.text) if m.end() > m.start()]

    def _spans(self, name: str) -> tuple[Span, ...]:
        got = self.get(name)  # never a code rule: a document naming one here is refused (D65)
        assert isinstance(got, Outcome), f"{name!r} has no positions"
        return got.spans or ()

    def _signal(self, sig: Signal) -> Result:
        if sig.kind == "pattern":
            return Outcome.of_spans(self._matches(sig))
        if sig.kind == "code_rule":
            if self.code is None:
                return Undecided(UNAVAILABLE, "operator code is scored by the rule runner, not here")
            answer = self.code(sig, self.text)
            if answer.count is None:
                return Undecided(answer.reason or "rule_error", answer.detail)
            return Outcome(answer.count > 0, answer.count, None)
        if sig.kind == "validator":
            check = VALIDATORS[sig.spec["validator"]]
            source = self._spans(sig.spec["span_of"])
            return Outcome.of_spans([s for s in source if check(self.text[s[0] : s[1]], sig.spec)])
        if sig.kind == "proximity":
            anchors = self._spans(sig.spec["anchor"])
            if not anchors:
                return NONE
            cues, limit = Nearby(self._matches(sig)), sig.spec["within_chars"]
            return Outcome.of_spans([a for a in anchors if cues.within(a, limit) is not None])
        if sig.kind == "wordlist":
            found = self._matches(sig)
            weight = sum(sig.weights.get(self.text[s:e].lower(), 0.0) for s, e in found)
            minimum = sig.spec.get("min_weight")
            fires = bool(found) and (minimum is None or weight >= minimum)
            return Outcome.of_spans(found) if fires else NONE
        raise RuntimeError(f"signal kind {sig.kind!r} is not evaluated here")

    def _expression(self, name: str) -> Result:
        expr = self.rs.expressions[name]
        got = [self.get(op) for op in expr.operands]
        undecided = [o for o in got if isinstance(o, Undecided)]
        if undecided:  # an operand operator code did not decide leaves this undecided too
            return undecided[0]
        ops = [o for o in got if isinstance(o, Outcome)]
        if expr.form == "signal":
            return ops[0]
        if expr.form == "not":
            return Outcome(not ops[0].fires, 0 if ops[0].fires else 1, None)
        if expr.form in ("all", "any"):
            fires = all(o.fires for o in ops) if expr.form == "all" else any(o.fires for o in ops)
            if not fires:
                return Outcome(False, 0, () if all(o.spans is not None for o in ops) else None)
            firing = [o for o in ops if o.fires]
            if all(o.spans is not None for o in ops):
                return Outcome.of_spans([s for o in firing for s in o.spans or ()])
            return Outcome(True, sum(o.count for o in firing), None)
        # within_n
        b = Nearby(ops[1].spans or ())
        joined = []
        for span in ops[0].spans or ():
            near = b.within(span, expr.n)
            if near is not None:
                joined.append((min(span[0], near[0]), max(span[1], near[1])))
        return Outcome.of_spans(joined)


def _overlaps(span: Span, cuts: Nearby) -> bool:
    """Whether a span of ``cuts`` shares a character with ``span`` (touching is not overlapping)."""
    lo = bisect.bisect_left(cuts.starts, span[0] - cuts.longest)
    hi = bisect.bisect_left(cuts.starts, span[1])  # a cut starting at span's end does not overlap it
    return any(end > span[0] for _, end in cuts.spans[lo:hi])


class Vetoed(Run):
    """The set as a dataset reads it: ``raw``'s outcomes, with every firing veto applied (see the module)."""

    def __init__(self, raw: Run) -> None:
        super().__init__(raw.rs, raw.text, raw.code)
        self.raw = raw
        cuts: dict[str, list[Span]] = {}
        self.fired: list[bool] = []
        for veto in self.rs.vetoes:
            when = raw.get(veto.when)  # never operator code (D74): always an Outcome with spans
            fires = isinstance(when, Outcome) and when.fires
            self.fired.append(fires)
            if fires:
                for name in veto.removes:
                    cuts.setdefault(name, []).extend(when.spans or ())  # type: ignore[union-attr]
        self.cuts = {name: Nearby(spans) for name, spans in cuts.items()}
        self._reads_cut: dict[str, bool] = {}

    def reads_cut(self, name: str) -> bool:
        """Whether ``name`` is cut or reads (through any chain) a name that is."""
        if name not in self._reads_cut:
            reads = self.rs.expressions[name].operands if name in self.rs.expressions else self.rs.signals[name].refs
            self._reads_cut[name] = name in self.cuts or any(self.reads_cut(op) for op in reads)
        return self._reads_cut[name]

    def get(self, name: str) -> Result:
        if not self.reads_cut(name):
            return self.raw.get(name)  # untouched by any veto: computed once, shared (operator code included)
        if name not in self.done:
            got = self._signal(self.rs.signals[name]) if name in self.rs.signals else self._expression(name)
            if name in self.cuts and isinstance(got, Outcome) and got.spans is not None:
                got = self._cut(name, got)
            self.done[name] = got
        return self.done[name]

    def _cut(self, name: str, got: Outcome) -> Outcome:
        kept = [s for s in got.spans or () if not _overlaps(s, self.cuts[name])]
        sig = self.rs.signals.get(name)
        if sig is not None and sig.kind == "wordlist":  # what is left must still weigh enough
            weight = sum(sig.weights.get(self.text[s:e].lower(), 0.0) for s, e in kept)
            minimum = sig.spec.get("min_weight")
            if kept and minimum is not None and weight < minimum:
                return NONE
        return Outcome.of_spans(kept)

    def removed(self) -> dict[str, int]:
        """How many spans the vetoes removed from each name they cut."""
        out = {}
        for name in self.cuts:
            before, after = self.raw.get(name), self.get(name)
            if isinstance(before, Outcome) and isinstance(after, Outcome):
                out[name] = before.count - after.count
        return out


def column(run: Vetoed, output: Output) -> Any:
    """One output column's value after the vetoes, or ``Undecided`` (operator code did not decide it)."""
    got = run.get(output.of)
    if isinstance(got, Undecided):
        return got
    if output.use == "fired":
        return got.fires
    if output.use == "count":
        return got.count
    return [run.text[s:e] for s, e in got.spans or ()]  # field: never operator code nor a not (refused)


def dataset_row(run: Vetoed) -> dict[str, Any]:
    """Each output column of the set, in document order, read after the vetoes; None where undecided."""
    row = {}
    for output in run.rs.outputs:
        value = column(run, output)
        row[output.column] = None if isinstance(value, Undecided) else value
    return row


def evaluate(
    rs: RuleSet,
    text: str,
    deadline: float | None = None,
    names: list[str] | None = None,
    code: CodeCall | None = None,
    run: Run | None = None,
) -> dict[str, Result | None]:
    """Each of ``names`` (default: every expression, in document order); ``None`` when the deadline
    passed before it started. Pass ``run`` to reuse outcomes already computed on the same text."""
    run = run if run is not None else Run(rs, text, code)
    out: dict[str, Result | None] = {}
    for name in names if names is not None else list(rs.expressions):
        if deadline is not None and time.perf_counter() > deadline:
            out[name] = None
            continue
        out[name] = run.get(name)
    return out


class CaseFailure(TypedDict, total=False):
    """An expectation a case states and this build disagrees with: of a rule (``name``) or of the row (``output``)."""

    case: Required[int]
    name: str
    output: str
    expected: Required[dict[str, object]]
    got: Required[dict[str, object]]


def case_failures(rs: RuleSet, code: CodeCall | None = None) -> list[CaseFailure]:
    """Every expectation of every case this build disagrees with (empty: the set proves itself).

    A case naming what operator code decides needs ``code`` (the runner); undecided, it fails
    with the runner's reason."""
    failures: list[CaseFailure] = []
    for i, case in enumerate(rs.cases):
        run = Run(rs, case["text"], code)
        for name, expected in case["expect"].items():
            got = run.get(name)
            want: dict[str, object]
            if isinstance(expected, bool):
                want = {"fires": expected}
            elif isinstance(expected, int):
                want = {"count": expected}
            else:
                want = dict(expected)
            if isinstance(got, Undecided):
                failures.append({"case": i, "name": name, "expected": want, "got": {"reason": got.reason}})
                continue
            actual: dict[str, object] = {"fires": got.fires, "count": got.count}
            if any(actual[k] != v for k, v in want.items()):
                failures.append({"case": i, "name": name, "expected": want, "got": actual})
        expected_row = case.get("outputs") or {}
        vetoed = Vetoed(run) if expected_row else None
        for name, value in expected_row.items():  # the dataset row, after the vetoes
            assert vetoed is not None
            got_value = column(vetoed, next(o for o in rs.outputs if o.column == name))
            if isinstance(got_value, Undecided):
                failures.append(
                    {"case": i, "output": name, "expected": {"value": value}, "got": {"reason": got_value.reason}}
                )
            elif got_value != value:
                failures.append({"case": i, "output": name, "expected": {"value": value}, "got": {"value": got_value}})
    return failures
