"""Rule signals beside armed probes: every named expression of each attached set, on every window
those probes report, within ``RULE_TIME_BUDGET_MS`` for the whole request.

Runs on the engine thread from the probes' ``after_generate`` (hook
``monitor_results``). A rule result never changes a probe result; a set's vetoes
and output columns are for building datasets and are not applied here.

A stateless request (``POST /api/probes/score``: ``monitored.stateless``) has no
live budget: there is no deadline, operator code is asked and waited for (within
the request's ``CallBudget``, shared by its inputs), nothing is rescored later and
the results are ``not_persisted``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from millm_host.api import MonitoredRequest

from .evaluate import Undecided, evaluate
from .rescore import Job
from .results import RequestFields, WhyUndecided, not_attached, rule_result, undecided_result
from .runtime import Runtime

log = logging.getLogger("millm.rulesets")

CODE_KEY = "rulesets.code"  # a stateless request's operator-code caller (its CallBudget), shared by its inputs


def results(runtime: Runtime, monitored: MonitoredRequest) -> list[dict[str, Any]]:
    """One rule result per attached set's expression and window of each armed behaviour."""
    attached, sets = runtime.attached, runtime.sets
    enabled = runtime.settings["RULE_SIGNALS_ENABLED"]
    stateless = monitored.stateless
    deadline = None if stateless else time.perf_counter() + runtime.settings["RULE_TIME_BUDGET_MS"] / 1000.0
    code = None
    if stateless:
        if CODE_KEY not in monitored.state:
            monitored.state[CODE_KEY] = runtime.code_caller()
        code = monitored.state[CODE_KEY]
    out: list[dict[str, Any]] = []
    for behaviour, windows in monitored.behaviours.items():
        entry = attached.get(behaviour)
        if entry is None:
            continue
        base: RequestFields = {
            "behaviour": behaviour,
            "request_id": monitored.request_id,
            "trace_id": monitored.trace_id,
            "span_id": monitored.span_id,
            "persistence": "not_persisted" if stateless else "persisted",
            "set_block": monitored.sets.get(behaviour),
        }
        loaded = sets.get(entry[0])
        if loaded is None:  # attached, yet not here: the rules are unknown and the probes decide
            out += [not_attached(entry[0], window, **base) for window in windows]
            continue
        names = list(loaded.rs.expressions) if loaded.rs is not None else []
        for window in windows:
            text = monitored.window(window)
            if not enabled or not loaded.evaluable or text.text is None:
                undecided: WhyUndecided
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
                outcomes = evaluate(loaded.rs, text.text, deadline, code=code)
            except Exception:
                log.exception("rule set %s failed on window %s", loaded.id, window)
                out += [rule_result(loaded, n, window, None, reason="rule_error", **base) for n in names]
                continue
            pending = []
            for name, outcome in outcomes.items():
                if isinstance(outcome, Undecided):  # live: operator code never delays a chat, skipped for now
                    pending.append(undecided_result(loaded, name, window, outcome, **base))
                    out.append(pending[-1])
                    continue
                reason = "rule_timeout" if outcome is None else None
                out.append(rule_result(loaded, name, window, outcome, reason=reason, **base))
            if pending and not stateless:  # scored by the rule runner after the response; revised in place
                runtime.rescorer.submit(Job(loaded, text.text, [dict(r) for r in pending]))
    return out
