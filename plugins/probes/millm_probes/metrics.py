"""The probes' series in ``/metrics``: verdicts by behaviour and probe, and the probe work per request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: Seconds of probe work one monitored request adds, from a cheap hook to a slow one.
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


def declare(metrics: Any) -> tuple[Any, Any]:
    """The verdict counter and the overhead histogram (declared at startup, so a scrape lists them at 0)."""
    verdicts = metrics.counter(
        "millm_probe_verdicts",
        "Probe verdicts reached, by behaviour, probe and verdict (true: the probe fired)",
        ("behaviour", "probe", "verdict"),
    )
    overhead = metrics.histogram(
        "millm_probe_overhead_seconds",
        "Probe work added to one monitored request (setup, hooks, scoring, recording)",
        buckets=OVERHEAD_BUCKETS,
    )
    return verdicts, overhead


def record(ctx: Any, results: Iterable[Mapping[str, Any]], overhead_s: float | None) -> None:
    """A monitored request's results: each reached verdict counted, the overhead observed, and each
    result an event of the request's span (no text is ever in one)."""
    results = list(results)
    verdicts, overhead = declare(ctx.host.metrics)
    for result in results:
        verdict = result.get("verdict")
        if verdict is not None:
            behaviour, probe = str(result.get("behaviour") or ""), str(result.get("name") or "")
            verdicts.inc(behaviour=behaviour, probe=probe, verdict="true" if verdict else "false")
    if overhead_s is not None:
        overhead.observe(overhead_s)
    ctx.host.metrics.trace_events(ctx, results, "mi.probe.result/v1")
