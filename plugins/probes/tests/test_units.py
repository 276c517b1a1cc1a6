"""Pieces checked in-process: window arithmetic, the header bound, trace parsing, and two paths no
served model here reaches (a model without a chat template, an engine without hooks)."""

from __future__ import annotations

import json

import pytest

from millm_host.api import RequestContext
from millm_probes import store
from millm_probes.scoring.windows import (
    Layout,
    NotScored,
    Span,
    last_user_span,
    measure,
    template_prefix_ids,
    window_span,
)
from millm_probes.serving import header, live
from millm_probes.serving.trace import trace_id_from


def test_window_spans():
    layout = Layout(positions=20, prompt_len=12, prefix=5, last_user=Span(3, 10))
    assert window_span(layout, "all", False) == Span(0, 20)
    assert window_span(layout, "all", True) == Span(5, 20)
    assert window_span(layout, "prompt", True) == Span(5, 12)
    assert window_span(layout, "response", True) == Span(12, 20)  # the prefix never touches response
    assert window_span(layout, "last_user", True) == Span(5, 10)
    assert window_span(layout, "last_user", False) == Span(3, 10)
    unknown = Layout(positions=20, prompt_len=None, prefix=None, last_user_reason="token_ids_have_no_turns")
    assert window_span(unknown, "all", True) == NotScored("skipped", "template_prefix_unknown")
    assert window_span(unknown, "all", False) == Span(0, 20)
    assert window_span(unknown, "prompt", False) == NotScored("skipped", "prompt_boundary_unknown")
    assert window_span(unknown, "last_user", False) == NotScored("skipped", "token_ids_have_no_turns")
    failed = Layout(positions=20, boundary_failure="prompt_boundary_conflict")
    assert window_span(failed, "response", False) == NotScored("failed", "prompt_boundary_conflict")
    assert window_span(Layout(positions=12, prompt_len=12), "response", False) == NotScored(
        "skipped", "no_scored_tokens"
    )


def test_reasoning_and_answer_windows():
    """A model that thinks: the block's positions, and the reply after it; the prefix never touches either."""
    thought = Layout(positions=20, prompt_len=12, prefix=5, reasoning=Span(12, 16))
    assert window_span(thought, "reasoning", True) == Span(12, 16)
    assert window_span(thought, "answer", True) == Span(16, 20)
    assert window_span(thought, "response", True) == Span(12, 20)
    not_split = Layout(positions=20, prompt_len=12)  # a model that does not think: all answer
    assert window_span(not_split, "reasoning", False) == NotScored("skipped", "reasoning_not_split")
    assert window_span(not_split, "answer", False) == Span(12, 20)
    no_block = Layout(positions=20, prompt_len=12, reasoning_reason="no_reasoning_block")
    assert window_span(no_block, "reasoning", False) == NotScored("skipped", "no_reasoning_block")
    unclosed = Layout(positions=20, prompt_len=12, reasoning=Span(12, 21))  # the block never closed
    assert window_span(unclosed, "reasoning", False) == Span(12, 20)
    assert window_span(unclosed, "answer", False) == NotScored("skipped", "no_scored_tokens")
    unknown = Layout(positions=20, prompt_len=None)
    assert window_span(unknown, "answer", False) == NotScored("skipped", "prompt_boundary_unknown")
    assert window_span(unknown, "reasoning", False) == NotScored("skipped", "prompt_boundary_unknown")


def test_traceparent_parsing():
    good = "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id_from(f"00-{good}-00f067aa0ba902b7-01") == good
    assert trace_id_from(f"01-{good}-00f067aa0ba902b7-01-future") == good  # a later version may add fields
    for bad in (
        None,
        "",
        f"ff-{good}-00f067aa0ba902b7-01",
        f"00-{good}-0000000000000000-01",
        f"00-{good}-00f067aa0ba902b7-01-extra",
        f"00-{good[:-1]}-00f067aa0ba902b7-01",
        f"00-{good}-00f067aa0ba902b7-01, 00-{good}-00f067aa0ba902b7-01",
    ):
        assert trace_id_from(bad) is None, bad


def _result(i: int, behaviour: str | None) -> dict:
    return {
        "name": f"probe-{i}",
        "score": 1.23456,
        "threshold": 1.0,
        "verdict": True,
        "status": "final",
        "reason": None,
        "rung": 2,
        "window": "all",
        "behaviour": behaviour,
        "probe_id": f"pr_{i:012x}",
    }


def test_header_truncates_whole_behaviours():
    results = [_result(0, "a"), _result(1, "a"), _result(2, "b"), _result(3, None)]
    full = header.render(results, 8192)
    assert full.count("probe-") == 4 and "score=1.235" in full
    two = len(header.render(results[:2], 8192))
    cut = header.render(results, two + 30)
    assert cut.count("probe-") == 2 and cut.endswith('"...";truncated;total=4')
    assert header.render(results, 40) == '"...";truncated;total=4'
    lone = [_result(4, None), _result(5, None)]  # no behaviour: each probe is left out on its own
    one = len(header.render(lone[:1], 8192))
    assert header.render(lone, one + 30) == header.render(lone[:1], 8192) + ', "...";truncated;total=2'


@pytest.fixture(scope="module")
def templateless_engine():
    """A real transformers engine, in this process, on a tiny model without a chat template."""
    from millm_engine_transformers.engine import TransformersEngine
    from millm_engine_transformers.spec import describe
    from millm_host.api import Settings
    from millm_host.testing.tiny_models import tiny_llama

    path = tiny_llama("probe-llama-plain", num_hidden_layers=2, chat_template=False)
    engine = TransformersEngine.load(describe(str(path)), Settings(environ={}), lambda message: None)
    engine.info.load_id = "in-process"
    return engine


def test_a_model_without_a_template_has_no_measurable_prefix(templateless_engine):
    engine = templateless_engine
    ids = engine.tokenize("user: hello\nassistant:")
    assert template_prefix_ids(engine) is None
    assert last_user_span(engine, [{"role": "user", "content": "hello"}], ids) == "no_chat_template"
    layout = measure(
        engine,
        ids,
        len(ids),
        prompt_len=len(ids),
        prefix_ids=template_prefix_ids(engine),
        conversation=[{"role": "user", "content": "hello"}],
        need_last_user=True,
    )
    assert window_span(layout, "all", True) == NotScored("skipped", "template_prefix_unknown")
    assert window_span(layout, "all", False) == Span(0, len(ids))
    assert window_span(layout, "last_user", False) == NotScored("skipped", "no_chat_template")


def test_an_engine_without_hooks_records_engine_unsupported(templateless_engine, tmp_path, lab):
    """A probe is armed only on a model whose parity ran, and an unload disarms it, so a served request
    never meets a hookless engine with a probe armed; the live path is checked here with one stood in."""
    from millm_host.api import Settings
    from millm_host.app import build
    from millm_probes.plugin import STATE_KEY
    from millm_probes.results import now_iso
    from millm_probes.runtime import Armed
    from millm_probes.scoring.bank import compile_probe

    settings = Settings(environ={"MILLM_DATA_DIR": str(tmp_path), "MILLM_LOAD_ON_START": "false"})
    app, host = build(settings)
    try:
        runtime = host.state[STATE_KEY]
        engine = templateless_engine
        identity = {
            "hf_id": engine.info.id,
            "revision": None,
            "d_model": engine.info.d_model,
            "n_layers": engine.info.n_layers,
            "chat_template_sha256": None,
        }
        doc = lab.definition(identity, name="hookless", layer=0, vectors=0)
        row = store.insert_probe(
            host.db,
            store.Probe(
                id=store.new_probe_id(),
                name="hookless",
                behaviour=None,
                version="1",
                provenance_probe_id=None,
                definition=json.dumps(doc),
                detector_digest="sha256:" + "0" * 64,
                detector_digest_source="computed",
                decision=doc["decision"],
                decision_digest="sha256:" + "0" * 64,
                decision_digest_source="computed",
                decision_revision=1,
                threshold_revision=1,
                armed=False,
                created_at=store.now(),
            ),
            "fail",
        )
        view = runtime.view(row)
        runtime.arm(Armed(view, compile_probe(row.id, view.definition, engine, None), "in-process", now_iso()))

        class Hookless:  # the engine's identity, without a module tree to hook
            name, info, hook_points = "gguf", engine.info, ()

        ctx = RequestContext(
            endpoint="completions",
            body={},
            params=None,
            headers={},
            model=None,
            engine_name="gguf",
            settings=settings,
            engine=Hookless(),
            prompts=[[1, 2, 3]],
            host=host,
        )
        assert live.begin(runtime, ctx) is None  # no hook for an engine that has none
        ctx.finished = True
        live.finish(runtime, ctx)
        [result] = ctx.state["probes"].results
        assert (result["outcome"], result["reason"], result["engine"]) == ("skipped", "engine_unsupported", "gguf")
        assert header.HEADER in live.headers(runtime, ctx)
        stored = store.list_events(
            host.db, probe_id=row.id, result_id=None, trace_id=None, fired=None, window=None, limit=10, after=None
        )["data"]
        assert stored == [result]
    finally:
        host.stop()


@pytest.mark.parametrize("seed", range(5))
def test_the_recommendation_counts_what_the_gate_accepts(seed):
    """For any unit costs, n dense probes on one layer pass the gate's projection exactly when n is at most
    what the recommendation says fits: one costing function."""
    import random
    from types import SimpleNamespace

    from millm_probes.capacity import costs

    rng = random.Random(seed)
    units = {half: {kind: rng.uniform(0.0, 0.5) for kind in costs.KINDS} for half in costs.HALVES}
    measurement = {"measurement_id": "pm_x", "units": units, "step": {"ms_per_token": 20.0, "ms_per_1k_prompt": 200.0}}
    settings = {"PROBE_SLOWDOWN_BUDGET_PCT": 5.0, "PROBE_BUDGET_HEADROOM": 0.9}
    recommendation = costs.recommendation(settings, measurement)
    fillable = recommendation["fillable_ms"]
    budget = {"basis": "measured", "units": units}
    for half in costs.HALVES:
        budget[half] = {"fillable_ms": fillable[half], "budget_ms": fillable[half] / 0.9, "source": "measured"}

    def dense(n: int) -> list[SimpleNamespace]:
        definition = SimpleNamespace(
            basis="residual",
            aggregation=SimpleNamespace(rule="mean"),
            read=SimpleNamespace(layer=3, hook_point="resid_post"),
        )
        return [SimpleNamespace(definition=definition, windows=["all"]) for _ in range(n)]

    fit = recommendation["dense_probes_fit"]
    assert costs.project(budget, dense(fit))["fits"] or fit == 0
    assert not costs.project(budget, dense(fit + 1))["fits"]
    projected = costs.project(budget, dense(fit))
    assert {h: projected[h]["cost_ms"] for h in costs.HALVES} == recommendation["dense_cost_ms"]


def test_parity_checks_the_batch_shape_only_where_monitored_rows_are_batched():
    from types import SimpleNamespace

    from millm_probes.arming.parity import _batch_shape_reason

    def runtime(force_serial: bool):
        return SimpleNamespace(settings={"PROBE_FORCE_SERIAL": force_serial})

    batching, alone = SimpleNamespace(concurrent_generation=True), SimpleNamespace(concurrent_generation=False)
    assert _batch_shape_reason(runtime(False), batching) is None
    assert _batch_shape_reason(runtime(True), batching) == "PROBE_FORCE_SERIAL serves monitored generations alone"
    assert _batch_shape_reason(runtime(False), alone) == "the engine serves each generation alone"


def test_the_tail_reads_a_row_that_commits_after_a_later_id_and_skips_its_own(tmp_path):
    """On PostgreSQL a transaction can commit after one that took a later id: the skipped id is read
    when it appears. A row this process wrote itself is not handed on again; each row is read once."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    import sqlalchemy as sa

    from millm_probes.feed.tail import Tail
    from millm_probes.tables import ProbeEvent

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'events.sqlite3'}")
    ProbeEvent.__table__.create(engine)
    delivered: list = []
    tail = Tail(SimpleNamespace(engine=engine), 1.0, delivered.extend)

    def write(row_id: int, request: str) -> dict:
        result = {"result_id": f"r{row_id}", "probe_id": "pr_1", "request_id": request}
        with engine.begin() as connection:
            connection.execute(
                sa.insert(ProbeEvent),
                [
                    dict(
                        id=row_id,
                        result_id=result["result_id"],
                        probe_id="pr_1",
                        request_id=request,
                        trace_id="0" * 32,
                        window="all",
                        outcome="completed",
                        fired=True,
                        result=result,
                        created_at=datetime.now(UTC),
                        session_id=None,
                        turn=None,
                    )
                ],
            )
        return result

    write(3, "req-b")
    assert tail.read() == 1 and tail.gaps.keys() == {1, 2}
    tail.wrote([{"result_id": "r1"}])  # this process's own, handed on when written
    write(1, "req-a")
    write(2, "req-a")
    assert tail.read() == 1 and not tail.gaps  # r2 only
    assert tail.read() == 0
    assert [[r["result_id"] for r in m["results"]] for m in delivered] == [["r3"], ["r2"]]
    assert [m["request_id"] for m in delivered] == ["req-b", "req-a"]
