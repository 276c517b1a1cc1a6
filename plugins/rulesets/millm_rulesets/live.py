"""Rule signals beside armed probes: every named expression of each attached set, on every window
those probes report, within ``RULE_TIME_BUDGET_MS`` for the whole request.

Runs on the engine thread from the probes' ``after_generate`` (hook
``monitor_results``). A rule result never changes a probe result; a set's vetoes
and output columns are for building datasets and are not applied here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from millm_host.api import MonitoredRequest

from .evaluate import Undecided, evaluate
from .rescore import Job
from .results import rule_result, undecided_result
from .runtime import Runtime

log = logging.getLogger("millm.rulesets")


def results(runtime: Runtime, monitored: MonitoredRequest) -> list[dict[str, Any]]:
    """One rule result per attached set's expression and window of each armed behaviour."""
    attached, sets = runtime.attached, runtime.sets
    enabled = runtime.settings["RULE_SIGNALS_ENABLED"]
    deadline = time.perf_counter() + runtime.settings["RULE_TIME_BUDGET_MS"] / 1000.0
    out: list[dict[str, Any]] = []
    for behaviour, windows in monitored.behaviours.items():
        entry = attached.get(behaviour)
        loaded = sets.get(entry[0]) if entry is not None else None
        if loaded is None:
            continue
        names = list(loaded.rs.expressions) if loaded.rs is not None else []
        base = {
            "behaviour": behaviour,
            "request_id": monitored.request_id,
            "trace_id": monitored.trace_id,
            "span_id": monitored.span_id,
        }
        for window in windows:
            text = monitored.window(window)
            if not enabled or not loaded.evaluable or text.text is None:
                if not enabled:
                    undecided = {"reason": "rule_signals_disabled", "result_outcome": "failed"}
                elif not loaded.evaluable:
                    undecided = {"reason": "rule_set_vectors_failed", "result_outcome": "failed"}
                else:  # the probes' own reason for this window (judge traffic, interrupted, no user turn…)
                    undecided = {"reason": text.reason, "result_outcome": text.outcome, "status": "unavailable"}
                out += [rule_result(loaded, name, window, None, **undecided, **base) for name in names]
                continue
            assert loaded.rs is not None
            try:
                outcomes = evaluate(loaded.rs, text.text, deadline)
            except Exception:
                log.exception("rule set %s failed on window %s", loaded.id, window)
                out += [rule_result(loaded, n, window, None, reason="rule_error", **base) for n in names]
                continue
            pending = []
            for name, outcome in outcomes.items():
                if isinstance(outcome, Undecided):  # operator code never delays a chat: skipped for now
                    pending.append(undecided_result(loaded, name, window, outcome, **base))
                    out.append(pending[-1])
                    continue
                reason = "rule_timeout" if outcome is None else None
                out.append(rule_result(loaded, name, window, outcome, reason=reason, **base))
            if pending:  # scored by the rule runner after the response; revised in place (same result_id)
                runtime.rescorer.submit(Job(loaded, text.text, [dict(r) for r in pending]))
    return out
