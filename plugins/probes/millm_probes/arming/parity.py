"""Parity: does this build reproduce the scores the producer recorded?

Each test vector's ``token_ids`` (never a re-render of its ``messages``) are
scored on the resident model, one vector per place in the queue, through the
same code live serving uses (probes checked together whose vectors carry the
same ids share that vector's forward pass, as armed probes share a request's). The gate is the score, within the spec's 1e-3 or
the definition's tolerance where that is tighter (the document parity checks
cannot loosen its own check); per-token divergence and whether ``messages``
re-render to the same ids are reported beside it and never decide.

Where monitored generations are served in a continuous batch (an engine that batches,
``PROBE_FORCE_SERIAL`` off), each vector is also checked in that shape: fed through
the serving batch beside two rows of other lengths (one longer, so its prefill is
left-padded), its prompt prefilled there and its last tokens fed one decode step each
(``Engine.replay_in_batch``), as a reply's are. A vector passes when every shape
checked does; the report lists the shapes (``shapes_checked``) and why one was not.

An unload stops parity between two vectors (409 ``PROBE_PARITY_STOPPED``, nothing stored):
the unload waits for the vector being checked, never for the rest (issue 35).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np

from millm_host.api import NoChatTemplate

from ..definition import TestVector
from ..errors import ParityStopped
from ..results import ProbeView, now_iso
from ..runtime import Runtime
from ..scoring.bank import Bank, CompiledProbe, ProbeUnusable, compile_probe
from ..scoring.capture import Capture
from ..scoring.evaluate import forward_columns, read_pairs
from ..scoring.windows import common_prefix, measure
from .gates import model_identity

#: The spec's bar (probe-monitors.txt, "within 1e-3"): a definition may tighten it, never loosen it.
MAX_TOLERANCE = 1e-3
#: A vector's last tokens fed by decode steps in the batch shape (the rest is its prompt's prefill):
#: enough steps beside other rows to read a reply's shape, few enough that a check stays one prefill's cost.
DECODED_TOKENS = 8
#: The longer neighbour's extra tokens: the vector's prefill row is left-padded by this many.
LONGER_BY = 7


def tolerance(definition: Any) -> float:
    """The tolerance parity holds ``definition`` to: its own, capped at ``MAX_TOLERANCE``."""
    return min(definition.parity.tolerance, MAX_TOLERANCE)


async def run_parity(
    runtime: Runtime, view: ProbeView, engine: Any, model_id: str
) -> tuple[dict[str, Any], CompiledProbe | None]:
    """Score every test vector on ``engine`` (model ``model_id``): the report (the caller stores it), and
    the head as compiled for ``engine`` for arming to reuse (None when it was not compiled)."""
    [checked] = await run_parity_many(runtime, [view], engine, model_id)
    return checked


async def run_parity_many(
    runtime: Runtime, views: Sequence[ProbeView], engine: Any, model_id: str
) -> list[tuple[dict[str, Any], CompiledProbe | None]]:
    """``run_parity`` for several probes at once (a behaviour's set): each probe's report is what checking
    it alone reports, but the probes whose vectors carry the same ``token_ids`` share one forward pass,
    each of their heads a column of one bank, as live serving reads them. Each distinct vector takes its
    own place in the queue, so a chat waits at most one forward pass behind a set being checked."""
    host = runtime.host
    identity = model_identity(host, model_id)
    batch_shape = _batch_shape_reason(runtime, engine)
    reports = [_new_report(view, identity, batch_shape) for view in views]
    if not engine.hook_points:
        for report in reports:
            report.update(status="cannot_run", reason="engine_unsupported")
        return [(report, None) for report in reports]
    by_ids: dict[tuple[int, ...], list[tuple[int, int, TestVector]]] = {}
    for i, view in enumerate(views):
        if not view.definition.test_vectors:
            reports[i].update(status="no_test_vectors", reason="the definition carries no test vectors")
        for index, vector in enumerate(view.definition.test_vectors):
            by_ids.setdefault(tuple(vector.token_ids), []).append((i, index, vector))
    heads: dict[int, CompiledProbe | ProbeUnusable] = {}  # view index -> its head, compiled once
    rows: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(views))}
    for checked, (ids, items) in enumerate(by_ids.items()):
        # an unload stops parity here: it waits for the vector being checked, never for the rest
        if not host.still_resident(engine):
            raise _stopped(checked, len(by_ids))
        async with host.engine_slot(model_id) as slot:
            if slot.engine is not engine:
                raise _stopped(checked, len(by_ids))
            scored = await slot.run(
                _score_vectors, runtime, views, engine, list(ids), items, heads, batch_shape is None
            )
        for (i, _, _), row in zip(items, scored, strict=True):
            rows[i].append(row)
    out: list[tuple[dict[str, Any], CompiledProbe | None]] = []
    for i, (view, report) in enumerate(zip(views, reports, strict=True)):
        if report["status"] == "no_test_vectors":
            out.append((report, None))
            continue
        report["vectors"] = sorted(rows[i], key=lambda row: row["index"])
        _decide(view.definition, report)
        head = heads.get(i)
        out.append((report, head if isinstance(head, CompiledProbe) else None))
    return out


def _stopped(checked: int, total: int) -> ParityStopped:
    return ParityStopped(
        f"the model began to unload (or changed) while parity ran: parity stopped after {checked} of {total} "
        "test vectors; nothing was stored and nothing was armed (load the model and check again)",
        param="probe_id",
    )


def _batch_shape_reason(runtime: Runtime, engine: Any) -> str | None:
    """Why monitored generations are not served in a continuous batch here (None: they are)."""
    if not getattr(engine, "concurrent_generation", False):
        return "the engine serves each generation alone"
    if runtime.settings["PROBE_FORCE_SERIAL"]:
        return "PROBE_FORCE_SERIAL serves monitored generations alone"
    return None


def _new_report(view: ProbeView, identity: dict[str, Any], batch_shape: str | None) -> dict[str, Any]:
    d = view.definition
    return {
        "object": "probe.parity_report",
        "report_id": "pa_" + secrets.token_hex(8),
        "probe_id": view.probe_id,
        "status": "passed",
        "reason": None,
        "tolerance": tolerance(d),
        "definition_tolerance": d.parity.tolerance,
        "window": d.scope,
        # The shapes each vector was scored in: alone (one forward pass), and in the serving batch
        # where monitored generations are served there; why a shape was not checked.
        "shapes_checked": ["alone"] if batch_shape else ["alone", "continuous_batch"],
        "shapes_not_checked": {"continuous_batch": batch_shape} if batch_shape else {},
        "vectors": [],
        "model": dict(identity),
        "created_at": now_iso(),
    }


def _decide(d: Any, report: dict[str, Any]) -> None:
    """The report's status from its vectors' rows."""
    failed = [row for row in report["vectors"] if not row["passed"]]
    if d.scope != "all":
        report.update(
            status="cannot_check", reason=f"scope {d.scope!r} was recorded under a mask the definition does not carry"
        )
    elif failed:
        first = failed[0]
        why = first.get("reason") or f"difference {first['difference']:.6g} > tolerance {tolerance(d):g}"
        report.update(
            status="failed",
            reason=f"{len(failed)} of {len(d.test_vectors)} vectors differ (vector {first['index']}: {why})",
        )


def parity_summary(report: dict[str, Any] | None) -> dict[str, Any]:
    """A probe's newest parity report in brief (``never_run`` without one)."""
    if report is None:
        return {"status": "never_run"}
    return {
        "status": report["status"],
        "report_id": report["report_id"],
        "reason": report.get("reason"),
        "model_load_id": report["model"]["load_id"],
        "created_at": report["created_at"],
    }


def _score_vectors(
    runtime: Runtime,
    views: Sequence[ProbeView],
    engine: Any,
    ids: list[int],
    items: list[tuple[int, int, TestVector]],
    heads: dict[int, CompiledProbe | ProbeUnusable],
    in_batch: bool,
) -> list[dict[str, Any]]:
    """One vector's ``token_ids`` for every (probe, vector) in ``items``, in one forward pass (engine
    thread), and with ``in_batch`` once more in the serving batch's shape; a row per item, as
    ``items`` lists them."""
    for i in {i for i, _, _ in items}:  # each head compiled once, on its first vector's turn
        if i not in heads:
            view = views[i]
            try:
                heads[i] = compile_probe(
                    view.probe_id, view.definition, engine, runtime.settings["PROBE_SAE_DIR"], runtime.encoders
                )
            except ProbeUnusable as exc:
                heads[i] = exc
    info = engine.info
    invalid = max(ids) >= info.vocab_size or (info.context_window is not None and len(ids) > info.context_window)
    usable = {} if invalid else {i: h for i, h in ((i, heads[i]) for i, _, _ in items) if isinstance(h, CompiledProbe)}
    bank = Bank(list(usable.values())) if usable else None
    columns = forward_columns(engine, bank, ids) if bank is not None else None
    batched = _batch_columns(engine, bank, ids) if in_batch and bank is not None else None
    drifts: dict[str, Any] = {}
    rows = []
    for i, index, vector in items:
        view = views[i]
        d = view.definition
        row: dict[str, Any] = {
            "index": index,
            "n_tokens": len(vector.token_ids),
            "score": None,
            "recorded": vector.score,
            "difference": None,
            "passed": False,
            "reason": None,
            "forward_shared_by": len(usable),  # probes scored on this vector's one forward pass
        }
        rows.append(row)
        head = heads[i]
        if isinstance(head, ProbeUnusable):
            row["reason"] = f"{head.reason}: {head}"
            continue
        if invalid or bank is None or columns is None:
            row["reason"] = "token_ids_invalid: outside the vocabulary or longer than the context window"
            continue
        prompt_len, failure = vector.prompt_tokens, None
        if prompt_len is not None and not 0 <= prompt_len <= len(ids):
            prompt_len, failure = None, "prompt_boundary_invalid"
        layout = measure(
            engine,
            ids,
            len(ids),
            prompt_len=prompt_len,
            boundary_failure=failure,
            prefix_ids=runtime.prefix_ids(engine) if d.aggregation.skip_template_prefix else None,
            no_turns="token_ids_have_no_turns",
        )
        reading = read_pairs([(view, d.scope)], bank, columns, layout)[0]
        row["outcome"] = reading.outcome
        if reading.score is None:
            row["reason"] = reading.reason
        else:
            row["score"] = reading.score
            row["difference"] = abs(reading.score - vector.score)
            row["passed"] = row["difference"] <= tolerance(d)
        row["shapes"] = {"alone": _shape_row(reading.score, vector.score, d)}
        if batched is not None:
            batch_columns, shape = batched
            in_shape = (
                read_pairs([(view, d.scope)], bank, batch_columns, layout)[0] if batch_columns is not None else None
            )
            shape_row = row["shapes"]["continuous_batch"] = {
                **_shape_row(None if in_shape is None else in_shape.score, vector.score, d),
                **shape,
            }
            if row["passed"] and not shape_row["passed"]:
                row["passed"] = False
                why = shape_row.get("error") or shape_row["reason"]
                if why is None:
                    why = f"difference {shape_row['difference']:.6g} > tolerance {tolerance(d):g}"
                row["reason"] = f"in the continuous batch: {why}"
        row["per_token"] = _per_token_divergence(bank.per_token(columns, view.probe_id), vector.per_token)
        key = json.dumps(vector.messages, sort_keys=True) if vector.messages else ""
        if key not in drifts:  # the same messages render the same ids: once per forward pass
            drifts[key] = _drift(engine, vector)
        row["tokenization_drift"] = drifts[key]
    return rows


def _shape_row(score: float | None, recorded: float, d: Any) -> dict[str, Any]:
    """One shape's score against the recorded one."""
    if score is None:
        return {"score": None, "difference": None, "passed": False, "reason": "not_scored"}
    difference = abs(score - recorded)
    return {"score": score, "difference": difference, "passed": difference <= tolerance(d), "reason": None}


def _batch_columns(engine: Any, bank: Bank, ids: list[int]) -> tuple[np.ndarray | None, dict[str, Any]]:
    """``ids`` read in the serving batch's shape (``Engine.replay_in_batch``): its prompt prefilled beside a
    longer and a shorter row, its last ``DECODED_TOKENS`` fed by decode steps beside theirs; the columns
    (None when a pass failed or fell short) and the shape it ran in."""
    n = len(ids)
    split = max(1, n - DECODED_TOKENS)
    given = ids[split:]
    longer = (ids * (2 + LONGER_BY // n))[: split + LONGER_BY]
    shorter = ids[: max(1, split // 2)]
    capture = Capture(bank.points, n)
    shape: dict[str, Any] = {"prefilled": split, "decoded": len(given), "beside": [len(longer), len(shorter)]}
    try:
        engine.replay_in_batch([(ids[:split], given, capture.hooks()), (longer, given[::-1], ()), (shorter, given, ())])
    except Exception as exc:  # reported as this shape's failure; the alone shape still stands
        shape.update(batch_rows=0, error=f"{type(exc).__name__}: {exc}")
        return None, shape
    shape.update(batch_rows=capture.batch_rows, passes=capture.passes)
    if capture.positions < n:
        shape["error"] = f"the batch read {capture.positions} of {n} positions"
        return None, shape
    return bank.columns(capture.rows()), shape


def _per_token_divergence(computed: np.ndarray, recorded: list[float] | None) -> dict[str, Any]:
    """How far the per-position trace is from the recorded one (reported, never gating)."""
    if recorded is None:
        return {"compared": 0, "reason": "no_per_token_recorded"}
    if len(recorded) != computed.size:
        return {"compared": 0, "reason": f"length_mismatch: {len(recorded)} recorded, {computed.size} positions"}
    diff = np.abs(computed - np.asarray(recorded, dtype=np.float64))
    return {
        "compared": int(diff.size),
        "max_abs_divergence": float(diff.max()),
        "mean_abs_divergence": float(diff.mean()),
    }


def _drift(engine: Any, vector: TestVector) -> dict[str, Any] | None:
    """Whether the vector's ``messages`` tokenize (as a live chat would) to its ``token_ids``."""
    if not vector.messages:
        return None
    try:
        rendered = engine.chat_ids(vector.messages, fallback=False)
    except NoChatTemplate:
        return {"reproduces": None, "reason": "no_chat_template"}
    except Exception as exc:
        return {"reproduces": None, "reason": f"render_failed: {type(exc).__name__}"}
    same = common_prefix(rendered, vector.token_ids)
    reproduces = same == len(rendered) == len(vector.token_ids)
    return {
        "reproduces": reproduces,
        "n_token_ids": len(vector.token_ids),
        "n_rendered": len(rendered),
        "first_difference": None if reproduces else same,
    }
