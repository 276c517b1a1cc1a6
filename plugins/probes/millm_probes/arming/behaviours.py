"""Arming and disarming a behaviour's set in one call, and listing the sets.

Arming is all or nothing: every probe runs its own gates (identity, evidence,
parity, scope, cost), then the set is checked once against the probe backstop
(``PROBE_MAX_ARMED``) and the cost budget; there is no limit in behaviours
(D83). A refusal lists every probe with the gate that stopped it. A dry run
runs every gate, arms nothing and shows the projected cost.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from millm_host.api import InvalidParameter, MillmError, ModelBusy, converge_soon, validate

from .. import store
from ..capacity import costs
from ..capacity.limits import budget_now, cost_refusal
from ..errors import GateRefused
from ..results import ProbeView, now_iso
from ..runtime import Armed, Runtime
from ..tables import Probe
from . import gates
from .parity import parity_summary, run_parity_many
from .sets import members_of, same_version, set_block, state_label

WAS_ARMED = ("restart", "model_unloaded")  # disarmed by the server, not by a person


class BehaviourNotFound(MillmError):
    status, code, type = 404, "behaviour_not_found", "not_found_error"


class VersionAmbiguous(MillmError):
    status, code = 409, "PROBE_BEHAVIOUR_VERSION_AMBIGUOUS"


class BehaviourRefused(MillmError):
    status, code = 409, "PROBE_BEHAVIOUR_REFUSED"


class BehaviourArmRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    dry_run: bool = False
    version: Annotated[str, Field(min_length=1, max_length=100)] | None = None
    probe_ids: Annotated[list[str], Field(min_length=1, max_length=1000)] | None = None
    acknowledgement: Annotated[str, Field(max_length=4000)] | None = None

    @model_validator(mode="after")
    def _one_selection(self) -> BehaviourArmRequest:
        if self.version is not None and self.probe_ids is not None:
            raise ValueError("name a version or the probe_ids, not both")
        if self.probe_ids is not None and len(set(self.probe_ids)) != len(self.probe_ids):
            raise ValueError("probe_ids lists a probe twice")
        return self


def _versions(rows: list[Probe]) -> list[str | None]:
    seen: list[str | None] = []
    for row in rows:
        if row.version not in seen:
            seen.append(row.version)
    return seen


def select(rows: list[Probe], key: str, version: str | None, probe_ids: list[str] | None) -> list[Probe]:
    """The probes of behaviour ``key`` one call arms: one version's set, or the probes named."""
    members = [r for r in rows if r.behaviour == key]
    if not members:
        raise BehaviourNotFound(f"no imported probe names the behaviour {key!r}", param="key")
    versions = _versions(members)
    if probe_ids is not None:
        by_id = {r.id: r for r in members}
        for i, probe_id in enumerate(probe_ids):
            if probe_id not in by_id:
                raise InvalidParameter(f"{probe_id!r} is not a probe of behaviour {key!r}", param=f"probe_ids[{i}]")
        return [by_id[i] for i in probe_ids]
    if version is not None:
        chosen = [r for r in members if r.version == version]
        if not chosen:
            raise InvalidParameter(
                f"behaviour {key!r} has no version {version!r}; its versions are {', '.join(map(str, versions))}",
                param="version",
            )
        return chosen
    if len(versions) > 1:
        raise VersionAmbiguous(
            f"behaviour {key!r} has probes of {len(versions)} versions ({', '.join(map(str, versions))}); "
            "name one with version, or the probes with probe_ids",
            param="version",
            extra={"versions": versions},
        )
    return members


def _member_json(runtime: Runtime, row: Probe) -> dict[str, Any]:
    view = runtime.view(row)
    armed = runtime.armed_entry(row.id)
    return {
        "probe_id": row.id,
        "name": row.name,
        "version": row.version,
        "layer": view.definition.read.layer,
        "hook_point": view.definition.read.hook_point,
        "rule": view.definition.aggregation.rule,
        "cost_kind": costs.kind_of(view),
        "armed": armed is not None,
        "armed_at": armed.armed_at if armed else None,
        "disarmed_reason": None if armed else row.disarmed_reason,
    }


def _group(runtime: Runtime, key: str, rows: list[Probe]) -> dict[str, Any]:
    """A behaviour's group as listed (blocking: reads the definitions not parsed yet)."""
    runtime.views(rows)
    armed_ids = set(runtime.snapshot.ids())
    versions = _versions(rows)
    armed_versions = [v for v in versions if any(r.id in armed_ids for r in rows if r.version == v)]
    current = armed_versions[0] if armed_versions else versions[-1]  # the armed one, else the newest imported
    members = same_version(members_of(rows), key, current)
    block = set_block(members, armed_ids)
    was_armed = block["armed_members"] == 0 and any(r.disarmed_reason in WAS_ARMED for r in rows)
    state = state_label(block["armed_members"], block["total_members"])
    if block["armed_members"] and not block["complete"]:
        names = {m.probe_id: m.name for m in members}
        state += ", missing " + ", ".join(f"{names[i]} ({i})" for i in block["missing_probe_ids"])
    return {
        "object": "probe.behaviour",
        "key": key,
        "versions": versions,
        "version": current,
        "state": state,
        **block,
        "was_armed": was_armed,
        "disarmed_reason": next((r.disarmed_reason for r in rows if r.disarmed_reason in WAS_ARMED), None)
        if was_armed
        else None,
        "members": [_member_json(runtime, r) for r in rows],
    }


def behaviour_list(runtime: Runtime) -> dict[str, Any]:
    """Every behaviour with its members and their state (blocking: reads the database)."""
    groups: dict[str, list[Probe]] = {}
    rows = [row for row in store.list_probes(runtime.host.db) if row.behaviour is not None]
    runtime.views(rows)  # the definitions not parsed yet, read in one query
    for row in rows:
        assert row.behaviour is not None  # rows without one were left out above
        groups.setdefault(row.behaviour, []).append(row)
    data = [_group(runtime, key, rows) for key, rows in sorted(groups.items())]
    return {"object": "list", "data": data, "rearm": [g["key"] for g in data if g["was_armed"]]}


async def _gate_probes(
    runtime: Runtime,
    views: list[ProbeView],
    engine: Any,
    model_id: str,
    identity: dict[str, Any],
    acknowledgement: str | None,
    budget: dict[str, Any],
    armed: costs.Shape,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every probe through its own gates, in order (the first refusal is its gate): each probe's outcome,
    and the heads parity compiled for those that passed.

    Parity runs for the whole set at once (``run_parity_many``: probes sharing a test vector share its
    forward pass) and its reports are stored in one transaction; each probe's cost is its own beside the
    armed set (``armed``), costed as measure costs it."""
    outcomes: dict[str, dict[str, Any]] = {}
    checking = []
    for view in views:
        outcome = outcomes[view.probe_id] = {
            "probe_id": view.probe_id,
            "name": view.name,
            "version": view.version,
            "gate": None,
            "code": None,
            "message": None,
            "warnings": [],
            "parity": None,
            "cost": None,
        }
        try:
            outcome["warnings"] = gates.gate_identity(view.definition, identity)
            gates.gate_evidence(view.definition, acknowledgement)
            checking.append(view)
        except GateRefused as exc:
            outcome.update(gate=exc.gate, code=exc.code, message=exc.message)
    checked = await run_parity_many(runtime, checking, engine, model_id) if checking else []
    await asyncio.to_thread(store.add_parity_report, runtime.host.db, [report for report, _ in checked])
    compiled: dict[str, Any] = {}
    for view, (report, head) in zip(checking, checked, strict=True):
        outcome = outcomes[view.probe_id]
        outcome["parity"] = parity_summary(report)
        try:
            gates.gate_parity(report)
            gates.gate_scope(view.definition)
            projection = costs.project(budget, armed.plus([view]))
            outcome["cost"] = projection
            if not projection["fits"]:
                raise cost_refusal(projection)
            compiled[view.probe_id] = head
        except GateRefused as exc:
            outcome.update(gate=exc.gate, code=exc.code, message=exc.message)
    return [outcomes[v.probe_id] for v in views], compiled


def _refusal_message(key: str, outcomes: list[dict[str, Any]], set_gates: list[dict[str, Any]]) -> str:
    parts = [f"{o['name']} ({o['probe_id']}): gate {o['gate']}" for o in outcomes if o["gate"]]
    parts += [f"the set: gate {g['gate']} ({g['message']})" for g in set_gates]
    return f"behaviour {key!r} was not armed (all or nothing): " + "; ".join(parts)


async def arm_behaviour(runtime: Runtime, key: str, body: dict[str, Any]) -> dict[str, Any]:
    request = validate(BehaviourArmRequest, body)
    host = runtime.host
    db = host.db
    async with runtime.lock:
        rows = await asyncio.to_thread(store.list_probes, db)
        chosen = select(rows, key, request.version, request.probe_ids)
        views = await asyncio.to_thread(runtime.views, chosen)  # parsing thousands of definitions: off the loop
        engine, resident_id = host.current_model()
        identity = gates.model_identity(host, resident_id)
        armed_views = [a.view for a in runtime.snapshot.armed]
        todo = [v for v in views if runtime.armed_entry(v.probe_id) is None]
        budget = await asyncio.to_thread(budget_now, runtime, resident_id, engine.info)
        armed_shape = costs.Shape.of(armed_views)
        outcomes, compiled = await _gate_probes(
            runtime, todo, engine, resident_id, identity, request.acknowledgement, budget, armed_shape
        )
        set_gates = []
        maximum = runtime.settings["PROBE_MAX_ARMED"]
        if len(armed_views) + len(todo) > maximum:
            set_gates.append(
                {
                    "gate": "limit",
                    "code": "PROBE_MAX_ARMED",
                    "message": f"{len(armed_views)} armed and {len(todo)} more would pass PROBE_MAX_ARMED ({maximum})",
                }
            )
        projection = costs.project(budget, armed_shape.plus(todo))
        if not projection["fits"]:
            set_gates.append(
                {"gate": "cost", "code": "PROBE_COST_BUDGET_EXCEEDED", "message": costs.over_message(projection)}
            )
        refused = bool(set_gates) or any(o["gate"] for o in outcomes)
        report = {
            "behaviour": key,
            "version": views[0].version,
            "dry_run": request.dry_run,
            "already_armed": [v.probe_id for v in views if runtime.armed_entry(v.probe_id) is not None],
            "probes": outcomes,
            "set_gates": set_gates,
            "projected_cost": projection,
        }
        if request.dry_run:
            return {"object": "probe.behaviour_dry_run", "would_arm": not refused, **report}
        if refused:
            raise BehaviourRefused(_refusal_message(key, outcomes, set_gates), param="key", extra=report)
        weak = [v for v in todo if v.definition.evidence.rung < 2]
        if weak and (request.acknowledgement or "").strip():
            await asyncio.to_thread(
                store.add_acknowledgements,
                db,
                [(v.probe_id, v.definition.evidence.rung) for v in weak],
                request.acknowledgement,
                engine.info.load_id,
            )
        entries = [Armed(v, compiled[v.probe_id], engine.info.load_id, now_iso()) for v in todo]
        if entries:
            await host.run_on_engine_thread(_commit_many, runtime, entries, engine)
        try:
            if todo:  # the desired state, in one transaction: the other replicas arm it through their gates
                await asyncio.to_thread(store.set_armed, db, [v.probe_id for v in todo], engine.info.load_id)
        except BaseException:
            runtime.disarm_many({v.probe_id for v in todo})
            raise
        rows = await asyncio.to_thread(store.list_probes, db)
        group = await asyncio.to_thread(_group, runtime, key, [r for r in rows if r.behaviour == key])
    converge_soon(host)
    return {**group, "armed_now": [v.probe_id for v in todo], **report}


def _commit_many(runtime: Runtime, entries: list[Armed], engine: Any) -> None:
    """Publish every head at once (engine thread), refused like one probe's when the model went."""
    if engine.info.load_id in runtime.unloaded or runtime.host.resident_engine() is not engine:
        raise ModelBusy("the model was unloaded while the behaviour was being armed; arm it again")
    runtime.arm_many(entries)


async def disarm_behaviour(runtime: Runtime, key: str) -> dict[str, Any]:
    """Disarm every probe of ``key``; a hooked point another armed probe reads stays hooked."""
    db = runtime.host.db
    async with runtime.lock:
        rows = [r for r in await asyncio.to_thread(store.list_probes, db) if r.behaviour == key]
        if not rows:
            raise BehaviourNotFound(f"no imported probe names the behaviour {key!r}", param="key")
        ids = {r.id for r in rows}
        await asyncio.to_thread(runtime.views, rows)  # parsed once, in bulk, off the loop
        mine = {
            (a.view.definition.read.layer, a.view.definition.read.hook_point)
            for a in runtime.snapshot.armed
            if a.view.probe_id in ids
        }
        gone = runtime.disarm_many(ids)
        were = set(gone)
        desired = [r.id for r in rows if r.armed or r.id in were]  # on every replica (desired state)
        if desired:
            await asyncio.to_thread(store.set_disarmed, db, "disarmed", desired)
        users: dict[tuple[int, str], list[str]] = {}
        for a in runtime.snapshot.armed:
            point = (a.view.definition.read.layer, a.view.definition.read.hook_point)
            users.setdefault(point, []).append(a.view.behaviour or a.view.name)
        rows = [r for r in await asyncio.to_thread(store.list_probes, db) if r.behaviour == key]
        group = await asyncio.to_thread(_group, runtime, key, rows)
    converge_soon(runtime.host)
    return {
        **group,
        "disarmed_now": gone,
        "hooks_removed": [{"layer": p[0], "hook_point": p[1]} for p in sorted(mine) if p not in users],
        "hooks_kept": [
            {"layer": p[0], "hook_point": p[1], "used_by": sorted(set(users[p]))} for p in sorted(mine) if p in users
        ],
    }
