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

A deadline (``time.perf_counter()`` seconds) bounds a run: an expression not
started before it is reported as out of time (``None``).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass

from .code_runner import UNAVAILABLE, CodeResult
from .document import RuleSet, Signal
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


def case_failures(rs: RuleSet, code: CodeCall | None = None) -> list[dict[str, object]]:
    """Every expectation of every case this build disagrees with (empty: the set proves itself).

    A case naming what operator code decides needs ``code`` (the runner); undecided, it fails
    with the runner's reason."""
    failures: list[dict[str, object]] = []
    for i, case in enumerate(rs.cases):
        run = Run(rs, case["text"], code)
        for name, expected in case["expect"].items():
            got = run.get(name)
            if isinstance(expected, bool):
                want = {"fires": expected}
            elif isinstance(expected, int):
                want = {"count": expected}
            else:
                want = dict(expected)
            if isinstance(got, Undecided):
                failures.append({"case": i, "name": name, "expected": want, "got": {"reason": got.reason}})
                continue
            actual = {"fires": got.fires, "count": got.count}
            if any(actual[k] != v for k, v in want.items()):
                failures.append({"case": i, "name": name, "expected": want, "got": actual})
    return failures
