"""Live rule results without a model: disabled signals, the time budget, a set that fails its self-check."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from millm_host.api import MonitoredRequest, WindowText
from millm_rulesets import live
from millm_rulesets.document import parse
from millm_rulesets.runtime import PUBLISHED, VECTORS_FAILED, Loaded


def _runtime(docs, *, enabled=True, budget_ms=20.0, status=PUBLISHED):
    rs = parse(docs.PII)
    loaded = Loaded("rs_1", rs.ruleset_id, rs.version, rs.digest, status, None, rs, datetime.now(UTC))
    return SimpleNamespace(
        attached={"pii": ("rs_1", datetime.now(UTC))},
        sets={"rs_1": loaded},
        settings={"RULE_SIGNALS_ENABLED": enabled, "RULE_TIME_BUDGET_MS": budget_ms},
    )


def _monitored(text="card 4111 1111 1111 1111", windows=("all",)):
    return MonitoredRequest(
        behaviours={"pii": windows, "other": ("all",)},
        request_id="req",
        trace_id="t" * 32,
        span_id="s" * 16,
        skip=None,
        interrupted=None,
        read_window=lambda window: WindowText(text),
    )


def test_disabled_reports_rule_signals_disabled_for_every_attached_signal(docs):
    got = live.results(_runtime(docs, enabled=False), _monitored())
    assert len(got) == len(docs.PII["expressions"])  # "other" has no set attached: nothing for it
    assert {(r["outcome"], r["reason"], r["fires"], r["count"]) for r in got} == {
        ("failed", "rule_signals_disabled", None, 0)
    }


def test_a_spent_budget_reports_rule_timeout_for_what_did_not_run(docs):
    got = live.results(_runtime(docs, budget_ms=-1.0), _monitored())
    assert {(r["reason"], r["status"], r["fires"]) for r in got} == {("rule_timeout", "unavailable", None)}


def test_within_budget_every_expression_is_final(docs):
    # A budget no machine runs out of: what is checked is the outcome within it, not the speed (the default
    # 20 ms ran out once on a busy 2-core CI machine); running out is test_a_spent_budget_reports_rule_timeout...
    got = live.results(_runtime(docs, budget_ms=10_000.0), _monitored(windows=("all", "prompt")))
    assert len(got) == 2 * len(docs.PII["expressions"])
    assert all(r["status"] == "final" and r["reason"] is None for r in got)


def test_a_set_that_failed_its_self_check_is_not_evaluated(docs):
    got = live.results(_runtime(docs, status=VECTORS_FAILED), _monitored())
    assert {(r["outcome"], r["reason"]) for r in got} == {("failed", "rule_set_vectors_failed")}


def test_an_unscored_window_carries_the_probes_reason(docs):
    monitored = _monitored()
    monitored.read_window = lambda window: WindowText(None, "skipped", "no_user_turn")
    got = live.results(_runtime(docs), monitored)
    assert {(r["outcome"], r["reason"], r["status"], r["count"]) for r in got} == {
        ("skipped", "no_user_turn", "unavailable", 0)
    }
