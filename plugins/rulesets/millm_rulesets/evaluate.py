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

A deadline (``time.perf_counter()`` seconds) bounds a run: an expression not
started before it is reported as out of time (``None``).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

from .document import RuleSet, Signal
from .validators import VALIDATORS

Span = tuple[int, int]


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

    def __init__(self, rs: RuleSet, text: str) -> None:
        self.rs, self.text = rs, text
        self.done: dict[str, Outcome] = {}

    def get(self, name: str) -> Outcome:
        if name not in self.done:
            if name in self.rs.signals:
                self.done[name] = self._signal(self.rs.signals[name])
            else:
                self.done[name] = self._expression(name)
        return self.done[name]

    def _matches(self, sig: Signal) -> list[Span]:
        return [m.span() for m in sig.regex.finditer(self.text) if m.end() > m.start()]

    def _signal(self, sig: Signal) -> Outcome:
        if sig.kind == "pattern":
            return Outcome.of_spans(self._matches(sig))
        if sig.kind == "validator":
            check = VALIDATORS[sig.spec["validator"]]
            source = self.get(sig.spec["span_of"]).spans or ()
            return Outcome.of_spans([s for s in source if check(self.text[s[0] : s[1]], sig.spec)])
        if sig.kind == "proximity":
            anchors = self.get(sig.spec["anchor"]).spans or ()
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
        raise RuntimeError(f"signal kind {sig.kind!r} is not evaluated here")  # code_rule: refused at import

    def _expression(self, name: str) -> Outcome:
        expr = self.rs.expressions[name]
        ops = [self.get(op) for op in expr.operands]
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
    rs: RuleSet, text: str, deadline: float | None = None, names: list[str] | None = None
) -> dict[str, Outcome | None]:
    """Each of ``names`` (default: every expression, in document order); ``None`` when the deadline
    passed before it started."""
    run = Run(rs, text)
    out: dict[str, Outcome | None] = {}
    for name in names if names is not None else list(rs.expressions):
        if deadline is not None and time.perf_counter() > deadline:
            out[name] = None
            continue
        out[name] = run.get(name)
    return out


def case_failures(rs: RuleSet) -> list[dict[str, object]]:
    """Every expectation of every case this build disagrees with (empty: the set proves itself)."""
    failures: list[dict[str, object]] = []
    for i, case in enumerate(rs.cases):
        run = Run(rs, case["text"])
        for name, expected in case["expect"].items():
            got = run.get(name)
            if isinstance(expected, bool):
                want = {"fires": expected}
            elif isinstance(expected, int):
                want = {"count": expected}
            else:
                want = dict(expected)
            actual = {"fires": got.fires, "count": got.count}
            if any(actual[k] != v for k, v in want.items()):
                failures.append({"case": i, "name": name, "expected": want, "got": actual})
    return failures
