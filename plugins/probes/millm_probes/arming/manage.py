"""Managing probes: import, arming through the gates, disarming, deleting, parity, recalibration.

Blocking work goes to a thread (the database) or the engine thread (forward
passes); changes to what is armed happen one at a time under the runtime's lock.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from millm_host.api import (
    Engine,
    InvalidParameter,
    ModelBusy,
    check_display_name,
    converge_soon,
    plain_name,
    replica_alone,
    validate,
)

from .. import digests, store
from ..capacity import costs
from ..capacity.limits import budget_now, cost_refusal
from ..definition import Decision, ProbeDefinition, parse
from ..errors import IdentityAlgorithmUnknown, IdentityMismatch, ProbeArmed, ProvenanceMismatch
from ..results import ProbeView, now_iso
from ..runtime import Armed, Runtime
from ..scoring.bank import CompiledProbe
from ..tables import Probe
from . import gates
from .parity import parity_summary, run_parity, tolerance
from .sets import members_of


class ArmRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    acknowledgement: Annotated[str, Field(max_length=4000)] | None = None


class CutProvenance(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    probe_id: Annotated[str, Field(min_length=1)]
    exported_at: str | None = None
    producer: str | None = None


class RecalibrationRequest(BaseModel):
    """A new cut: the bar and nothing else (a detector field is an unknown field here)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    provenance: CutProvenance
    decision: Decision
    decision_digest: str | None = None


def probe_json(runtime: Runtime, row: Probe, view: ProbeView) -> dict[str, Any]:
    """A probe as the management API shows it (weights stay in the definition)."""
    d = view.definition
    armed = runtime.armed_entry(row.id)
    return {
        "id": row.id,
        "object": "probe",
        "name": row.name,
        "behaviour": row.behaviour,
        "version": row.version,
        "provenance_probe_id": row.provenance_probe_id,
        "model": d.model.model_dump(),
        "read": d.read.model_dump(),
        "scope": d.scope,
        "basis": d.basis,
        "sae": d.sae.model_dump() if d.sae else None,
        "aggregation": d.aggregation.model_dump(),
        "decision": row.decision,
        "windows": view.windows,
        "rung": d.evidence.rung,
        "rung_language": d.rung_language,
        "provisional": d.evidence.provisional,
        "exporter_acknowledgement": d.evidence.acknowledgement,
        "identity_algorithm": digests.ALGORITHM,
        "detector_digest": row.detector_digest,
        "detector_digest_source": row.detector_digest_source,
        "decision_digest": row.decision_digest,
        "decision_digest_source": row.decision_digest_source,
        "decision_revision": row.decision_revision,
        "threshold_revision": row.threshold_revision,
        "n_test_vectors": len(d.test_vectors),
        "parity_tolerance": tolerance(d),
        "armed": armed is not None,
        "armed_at": armed.armed_at if armed else None,
        "armed_load_id": armed.load_id if armed else None,
        "disarmed_reason": None if armed else row.disarmed_reason,
        "created_at": row.created_at.isoformat(),
    }


def probe_list(runtime: Runtime) -> dict[str, Any]:
    """Every imported probe (blocking: reads the database and parses definitions)."""
    rows = store.list_probes(runtime.host.db)
    views = runtime.views(rows)
    return {"object": "list", "data": [probe_json(runtime, row, view) for row, view in zip(rows, views, strict=True)]}


def _detail(runtime: Runtime, probe_id: str) -> dict[str, Any]:
    db = runtime.host.db
    row = store.get_probe(db, probe_id)
    data = probe_json(runtime, row, runtime.view(row))
    data["parity"] = parity_summary(store.latest_parity_reports(db, [probe_id]).get(probe_id))
    data["acknowledgements"] = store.acknowledgements(db, probe_id)
    data["recalibrations"] = store.recalibrations(db, probe_id)
    return data


async def probe_detail(runtime: Runtime, probe_id: str) -> dict[str, Any]:
    """A probe with its latest parity report, acknowledgements and recalibrations."""
    return await asyncio.to_thread(_detail, runtime, probe_id)


# --- import ---------------------------------------------------------------------------------


def check_names(definition: ProbeDefinition) -> None:
    """Names operators read carry no hidden characters; an SAE id names one directory of PROBE_SAE_DIR."""
    check_display_name(definition.name, "name")
    if definition.behaviour is not None:
        check_display_name(definition.behaviour, "behaviour")
    if definition.sae is not None:
        plain_name(check_display_name(definition.sae.sae_id, "sae.sae_id"), "sae.sae_id")


async def import_probe(runtime: Runtime, raw: bytes, document: Any, on_conflict: str) -> dict[str, Any]:
    """Check a definition and its digests, then store it verbatim; nothing is stored on refusal."""
    if on_conflict not in ("rename", "fail"):
        raise InvalidParameter(f"on_conflict must be rename or fail, not {on_conflict!r}", param="on_conflict")
    imported = await asyncio.to_thread(_import, runtime, raw, document, on_conflict)
    if imported["behaviour"] is not None:  # the behaviour's set grew: its results say so from now on
        async with runtime.lock:
            await refresh_members(runtime)
    return imported


async def refresh_members(runtime: Runtime) -> None:
    """Re-read the behaviour sets (hold ``runtime.lock``: it republishes the armed set)."""
    rows = await asyncio.to_thread(store.probe_states, runtime.host.db)
    runtime.set_members(members_of(rows))


def _import(runtime: Runtime, raw: bytes, document: Any, on_conflict: str) -> dict[str, Any]:
    definition = parse(document)
    check_names(definition)
    computed = {
        "detector_digest": digests.detector_digest(document),
        "decision_digest": digests.decision_digest(document.get("decision")),
    }
    identity = document.get("identity")
    try:
        mismatches = digests.verify(identity, computed)
    except ValueError:
        raise IdentityAlgorithmUnknown(
            f"identity.algorithm {identity.get('algorithm')!r} is not one this server knows "
            f"({digests.ALGORITHM}); re-export the definition",
            param="identity.algorithm",
        ) from None
    if mismatches:
        raise IdentityMismatch(
            "; ".join(f"{m['field']} is {m['stated']} in the definition but {m['computed']} here" for m in mismatches)
            + "; re-export the definition",
            param=mismatches[0]["field"],
            extra={"mismatches": mismatches},
        )
    row = Probe(
        id=store.new_probe_id(),
        name=definition.name,
        behaviour=definition.behaviour,
        version=None if definition.version is None else str(definition.version),
        provenance_probe_id=definition.provenance.probe_id,
        definition=raw.decode("utf-8"),
        detector_digest=computed["detector_digest"],
        detector_digest_source=digests.source(identity, "detector_digest"),
        decision=document.get("decision"),
        decision_digest=computed["decision_digest"],
        decision_digest_source=digests.source(identity, "decision_digest"),
        decision_revision=1,
        threshold_revision=1,
        armed=False,
        created_at=store.now(),
    )
    row = store.insert_probe(runtime.host.db, row, on_conflict)
    return probe_json(runtime, row, runtime.view(row))


# --- parity, arming, disarming ---------------------------------------------------------------


async def check_parity(runtime: Runtime, probe_id: str) -> dict[str, Any]:
    """Run parity on the resident model and store the report. Never arms."""
    host = runtime.host
    row = await asyncio.to_thread(store.get_probe, host.db, probe_id)
    engine, resident_id = host.current_model()
    report, _ = await run_parity(runtime, runtime.view(row), engine, resident_id)
    await asyncio.to_thread(store.add_parity_report, host.db, report)
    return report


async def arm(runtime: Runtime, probe_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """Arm through the gates (limit, identity, evidence, parity, scope, cost); a refusal names its gate.

    The probe is then armed in the database too (desired state): every other replica arms it
    through its own gates (converge.py).
    """
    request = validate(ArmRequest, body)
    async with runtime.lock:
        row = await asyncio.to_thread(store.get_probe, runtime.host.db, probe_id)
        result = await arm_here(runtime, row, request.acknowledgement, desired=True)
    converge_soon(runtime.host)
    return result


async def arm_here(runtime: Runtime, row: Probe, acknowledgement: str | None, *, desired: bool) -> dict[str, Any]:
    """Arm ``row`` on this replica through every gate (hold ``runtime.lock``).

    ``desired``: an operator's arm, stored as the desired state with its acknowledgement;
    else a replica converging to what another replica's operator armed.
    """
    host = runtime.host
    probe_id = row.id
    view = runtime.view(row)
    if runtime.armed_entry(probe_id) is not None:
        return {**probe_json(runtime, row, view), "warnings": []}
    d = view.definition
    engine, resident_id = host.current_model()
    gates.gate_limit(len(runtime.snapshot.armed), runtime.settings["PROBE_MAX_ARMED"])
    warnings = gates.gate_identity(d, gates.model_identity(host, resident_id))
    gates.gate_evidence(d, acknowledgement)
    report, compiled = await run_parity(runtime, view, engine, resident_id)
    await asyncio.to_thread(store.add_parity_report, host.db, report)
    gates.gate_parity(report)
    gates.gate_scope(d)
    budget = await asyncio.to_thread(budget_now, runtime, resident_id, engine.info)
    projection = costs.project(budget, [*(a.view for a in runtime.snapshot.armed), view])
    if not projection["fits"]:
        raise cost_refusal(projection)
    if desired and acknowledgement and acknowledgement.strip():
        await asyncio.to_thread(
            store.add_acknowledgement,
            host.db,
            probe_id,
            acknowledgement,
            d.evidence.rung,
            engine.info.load_id,
        )
    assert compiled is not None  # parity passed, so every vector was scored with it
    await host.run_on_engine_thread(_commit_arm, runtime, view, compiled, engine)
    if desired:
        try:
            await asyncio.to_thread(store.set_armed, host.db, probe_id, engine.info.load_id)
        except BaseException:
            runtime.disarm(probe_id)
            raise
        if engine.info.load_id in runtime.unloaded and replica_alone(host):
            # unloaded meanwhile: its disarming (model_unloading) may have been written before this arming
            await asyncio.to_thread(store.set_disarmed, host.db, "model_unloaded", probe_id)
            raise _unloaded_while_arming()
    return {**probe_json(runtime, row, view), "warnings": warnings, "parity": parity_summary(report)}


def _unloaded_while_arming() -> ModelBusy:
    return ModelBusy(
        "the model began to unload while the probe was being armed; nothing was armed (load it and arm again)"
    )


def _commit_arm(runtime: Runtime, view: ProbeView, compiled: CompiledProbe, engine: Engine) -> None:
    """Publish the head parity compiled for ``engine`` (engine thread: serialised with unloads)."""
    if engine.info.load_id in runtime.unloaded or not runtime.host.still_resident(engine):
        raise _unloaded_while_arming()
    runtime.arm(Armed(view, compiled, engine.info.load_id, now_iso()))


async def disarm(runtime: Runtime, probe_id: str) -> dict[str, Any]:
    host = runtime.host
    async with runtime.lock:
        row = await asyncio.to_thread(store.get_probe, host.db, probe_id)
        if runtime.disarm(probe_id):
            row.disarmed_reason = "disarmed"
        if row.armed:  # disarmed on every replica (desired state), even one this replica never armed
            await asyncio.to_thread(store.set_disarmed, host.db, "disarmed", probe_id)
            row.disarmed_reason = "disarmed"
        converge_soon(host)
        return probe_json(runtime, row, runtime.view(row))


async def delete(runtime: Runtime, probe_id: str) -> dict[str, Any]:
    """Delete a disarmed probe (its stored results stay, listed as another probe's)."""
    host = runtime.host
    async with runtime.lock:
        await asyncio.to_thread(store.get_probe, host.db, probe_id)
        if runtime.armed_entry(probe_id) is not None:
            raise ProbeArmed(f"probe {probe_id} is armed; disarm it before deleting it", param="probe_id")
        await asyncio.to_thread(store.delete_probe, host.db, probe_id)
        runtime.forget_probe(probe_id)
        await refresh_members(runtime)
        return {"id": probe_id, "object": "probe", "deleted": True}


# --- recalibration ---------------------------------------------------------------------------


async def recalibrate(runtime: Runtime, probe_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """Move the bar only: both revisions move, the stored definition never changes."""
    request = validate(RecalibrationRequest, body)
    decision = body["decision"]
    host = runtime.host
    if (
        request.decision.threshold is not None
        and request.decision.target_fpr is None
        and not (request.decision.threshold_source or "").strip()
    ):
        raise InvalidParameter(
            "a threshold needs a false-positive budget (target_fpr) or a named source (threshold_source)",
            param="decision.threshold",
            code="PROBE_THRESHOLD_UNSOURCED",
        )
    computed = digests.decision_digest(decision)
    if request.decision_digest is not None and request.decision_digest != computed:
        raise IdentityMismatch(
            f"decision_digest is {request.decision_digest} in the cut but {computed} here",
            param="decision_digest",
            extra={
                "mismatches": [{"field": "decision_digest", "stated": request.decision_digest, "computed": computed}]
            },
        )
    async with runtime.lock:
        row = await asyncio.to_thread(store.get_probe, host.db, probe_id)
        if request.provenance.probe_id != row.provenance_probe_id:
            raise ProvenanceMismatch(
                f"the cut is for provenance.probe_id {request.provenance.probe_id!r}; this probe's is "
                f"{row.provenance_probe_id!r}",
                param="provenance.probe_id",
            )
        source = "producer" if request.decision_digest is not None else "computed"
        row = await asyncio.to_thread(store.recalibrate, host.db, probe_id, decision, computed, source)
        view = runtime.view(row)
        runtime.update_view(view)
        return probe_json(runtime, row, view)
