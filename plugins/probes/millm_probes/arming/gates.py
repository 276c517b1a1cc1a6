"""The arming gates, in the spec's order: limit, identity, evidence, parity, scope.

Each refusal names its gate, because "wrong model" and "needs your
acknowledgement" call for different actions; the identity gate names every
mismatched field at once, so one retry shows whether the model or the probe is wrong.
"""

from __future__ import annotations

from typing import Any

from ..definition import ModelBlock, ProbeDefinition
from ..errors import GateRefused, mismatch_message

IDENTITY_FIELDS = ("hf_id", "d_model", "n_layers", "chat_template_sha256")
MODEL_KEYS = ("id", "hf_id", "revision", "d_model", "n_layers", "chat_template_sha256", "load_id")
PARITY_PASSING = ("passed", "cannot_check")  # cannot_check is the scope gate's to refuse


def model_identity(host: Any, model_id: str) -> dict[str, Any]:
    """The resident model's identity, as ``GET /api/models/{id}`` reports it (``model_id`` is resident)."""
    detail = host.model_detail(model_id)
    return {key: detail[key] for key in MODEL_KEYS}


def identity_check(model: ModelBlock, identity: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """(every mismatched field, warnings). Two known revisions that differ refuse; an unknown one warns."""
    mismatches = [
        {"field": f"model.{name}", "probe": getattr(model, name), "model": identity[name]}
        for name in IDENTITY_FIELDS
        if getattr(model, name) != identity[name]
    ]
    warnings = []
    if model.revision is not None and identity["revision"] is not None:
        if model.revision != identity["revision"]:
            mismatches.append({"field": "model.revision", "probe": model.revision, "model": identity["revision"]})
    else:
        warnings.append(
            "revision_unknown: which commit the probe was fitted on, or which is on disk, is not known; "
            "the other identity fields match"
        )
    return mismatches, warnings


def gate_limit(armed: int, maximum: int) -> None:
    if armed >= maximum:
        raise GateRefused(
            "limit",
            "PROBE_MAX_ARMED",
            f"{armed} probes are armed; PROBE_MAX_ARMED is {maximum}. Disarm one first",
            max_armed=maximum,
        )


def gate_identity(definition: ProbeDefinition, identity: dict[str, Any]) -> list[str]:
    """Refuse a probe fitted on another model; return the warnings to report when it passes."""
    mismatches, warnings = identity_check(definition.model, identity)
    if mismatches:
        raise GateRefused(
            "identity",
            "PROBE_MODEL_MISMATCH",
            f"the loaded model is not the one this probe was fitted on: {mismatch_message(mismatches)}",
            mismatches=mismatches,
        )
    return warnings


def gate_evidence(definition: ProbeDefinition, acknowledgement: str | None) -> None:
    rung = definition.evidence.rung
    if rung < 2 and not (acknowledgement or "").strip():
        raise GateRefused(
            "evidence",
            "PROBE_ACKNOWLEDGEMENT_REQUIRED",
            f"this probe is at rung {rung} (below 2: not shown to detect on unseen tasks); "
            "arm it with an acknowledgement saying why",
            rung=rung,
        )


def gate_parity(report: dict[str, Any]) -> None:
    if report["status"] not in PARITY_PASSING:
        raise GateRefused(
            "parity",
            "PROBE_PARITY_FAILED",
            f"this build does not reproduce the recorded scores ({report['status']}"
            f"{': ' + report['reason'] if report.get('reason') else ''})",
            parity_report_id=report["report_id"],
            parity_status=report["status"],
        )


def gate_scope(definition: ProbeDefinition) -> None:
    if definition.scope != "all":
        raise GateRefused(
            "scope",
            "PROBE_SCOPE_UNVERIFIABLE",
            f"scope {definition.scope!r} was recorded under a mask the definition does not carry, "
            "so parity cannot verify it; only scope 'all' arms",
            scope=definition.scope,
        )
