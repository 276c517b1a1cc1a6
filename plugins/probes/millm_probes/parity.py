"""Parity: does this build reproduce the scores the producer recorded?

Each test vector's ``token_ids`` (never a re-render of its ``messages``) are
scored on the resident model, one vector per place in the queue, through the
same code live serving uses. The gate is the score, within the spec's 1e-3 or
the definition's tolerance where that is tighter (the document parity checks
cannot loosen its own check); per-token divergence and whether ``messages``
re-render to the same ids are reported beside it and never decide.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np

from millm_host.api import NoChatTemplate

from .definition import TestVector
from .evaluate import compile_bank, forward_columns, read_pairs
from .gates import model_identity
from .results import ProbeView, now_iso
from .runtime import Runtime
from .scoring import CompiledProbe
from .windows import common_prefix, measure

#: The spec's bar (probe-monitors.txt, "within 1e-3"): a definition may tighten it, never loosen it.
MAX_TOLERANCE = 1e-3


def tolerance(definition: Any) -> float:
    """The tolerance parity holds ``definition`` to: its own, capped at ``MAX_TOLERANCE``."""
    return min(definition.parity.tolerance, MAX_TOLERANCE)


async def run_parity(
    runtime: Runtime, view: ProbeView, engine: Any, model_id: str
) -> tuple[dict[str, Any], CompiledProbe | None]:
    """Score every test vector on ``engine`` (model ``model_id``): the report (the caller stores it), and
    the head as compiled for ``engine`` for arming to reuse (None when it was not compiled)."""
    host = runtime.host
    d = view.definition
    report: dict[str, Any] = {
        "object": "probe.parity_report",
        "report_id": "pa_" + secrets.token_hex(8),
        "probe_id": view.probe_id,
        "status": "passed",
        "reason": None,
        "tolerance": tolerance(d),
        "definition_tolerance": d.parity.tolerance,
        "window": d.scope,
        "vectors": [],
        "model": model_identity(host, model_id),
        "created_at": now_iso(),
    }
    if not engine.hook_points:
        report.update(status="cannot_run", reason="engine_unsupported")
        return report, None
    if not d.test_vectors:
        report.update(status="no_test_vectors", reason="the definition carries no test vectors")
        return report, None
    prepared: dict[str, Any] = {}
    for index, vector in enumerate(d.test_vectors):
        if host.registry.engine is not engine:
            report.update(status="model_changed", reason="the model changed while parity ran")
            return report, None
        async with host.engine_slot(model_id) as slot:
            if slot.engine is not engine:
                report.update(status="model_changed", reason="the model changed while parity ran")
                return report, None
            row = await slot.run(_score_vector, runtime, view, engine, index, vector, prepared)
        report["vectors"].append(row)
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
    bank = prepared["bank"]
    return report, (bank.probes[0] if bank is not None else None)


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


def _score_vector(
    runtime: Runtime, view: ProbeView, engine: Any, index: int, vector: TestVector, prepared: dict[str, Any]
) -> dict[str, Any]:
    """One vector on the engine thread."""
    d = view.definition
    row: dict[str, Any] = {
        "index": index,
        "n_tokens": len(vector.token_ids),
        "score": None,
        "recorded": vector.score,
        "difference": None,
        "passed": False,
        "reason": None,
    }
    if "bank" not in prepared:  # compiled once, on the first vector's turn on the engine thread
        prepared["bank"], prepared["unusable"] = compile_bank(
            [view], engine, runtime.settings["PROBE_SAE_DIR"], runtime.encoders
        )
    bank = prepared["bank"]
    if bank is None:
        problem = prepared["unusable"][view.probe_id]
        row["reason"] = f"{problem.reason}: {problem}"
        return row
    ids = vector.token_ids
    info = engine.info
    if max(ids) >= info.vocab_size or (info.context_window is not None and len(ids) > info.context_window):
        row["reason"] = "token_ids_invalid: outside the vocabulary or longer than the context window"
        return row
    columns = forward_columns(engine, bank, ids)
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
    row["per_token"] = _per_token_divergence(bank.per_token(columns, view.probe_id), vector.per_token)
    row["tokenization_drift"] = _drift(engine, vector)
    return row


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
