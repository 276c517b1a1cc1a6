"""The Probe capacity routes: measure a model, read its budget and recommendation, set its limits."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from millm_host.api import MillmError, ModelBusy, admin_activity, validate

from ..errors import GateRefused, ProbeArmed
from ..results import now_iso
from ..runtime import Runtime
from . import costs, store
from .measure import Stop, measure


class ModelNotResident(MillmError):
    status, code = 409, "PROBE_CAPACITY_MODEL_NOT_LOADED"


class RecommendationChanged(MillmError):
    status, code = 409, "PROBE_RECOMMENDATION_CHANGED"


class NotMeasured(MillmError):
    status, code = 409, "PROBE_CAPACITY_NOT_MEASURED"


class LimitsRequest(BaseModel):
    """Approve the recommendation (as a share of the model's own time), override it, or clear what was set."""

    model_config = ConfigDict(strict=True, extra="forbid")

    action: Literal["approve", "override", "clear"]
    recommendation_digest: str | None = None
    pct: Annotated[float, Field(gt=0, le=100)] | None = None
    ms_per_token: Annotated[float, Field(gt=0, le=10_000)] | None = None
    ms_per_1k_prompt: Annotated[float, Field(gt=0, le=100_000)] | None = None
    set_by: Annotated[str, Field(min_length=1, max_length=200)] | None = None

    @model_validator(mode="after")
    def _fields_of_action(self) -> LimitsRequest:
        ms = self.ms_per_token is not None or self.ms_per_1k_prompt is not None
        if self.action == "approve" and (self.recommendation_digest is None or self.pct is not None or ms):
            raise ValueError("approve takes the recommendation_digest you read, and nothing else")
        if self.action == "override":
            if self.recommendation_digest is not None:
                raise ValueError("override takes pct or ms_per_token / ms_per_1k_prompt, not a recommendation")
            if (self.pct is None) == (not ms):
                raise ValueError("override takes either pct or ms_per_token / ms_per_1k_prompt")
        if self.action == "clear" and (self.recommendation_digest is not None or self.pct is not None or ms):
            raise ValueError("clear takes no limits")
        return self


def resident_info(runtime: Runtime, model_id: str) -> Any | None:
    """The ModelInfo of ``model_id`` when it is the resident model (404 for an unknown id)."""
    host = runtime.host
    host.model_detail(model_id)
    engine = host.resident_engine()
    return engine.info if engine is not None and engine.info.id == model_id else None


def budget_now(runtime: Runtime, model_id: str, info: Any | None) -> dict[str, Any]:
    """The budget in force for ``model_id`` (blocking: reads the database)."""
    measurement, limits = store.read(runtime.host.db, model_id)
    return costs.budget(runtime.settings, measurement, limits, info)


def armed_cost(runtime: Runtime) -> dict[str, Any] | None:
    """The armed set's cost against the resident model's budget (None with no model resident)."""
    engine = runtime.host.resident_engine()
    if engine is None:
        return None
    budget = budget_now(runtime, engine.info.id, engine.info)
    armed = [a.view for a in runtime.snapshot.armed]
    projection = costs.project(budget, armed)
    rows = int(engine.inference().get("running") or 0)
    half = costs.half_at_rows(budget["halves"], rows)
    running = {  # what each monitored row pays now, at the batch's size
        "rows": rows,
        "half": half,
        "cost_ms_per_row_token": projection[half]["cost_ms"],
        "model_ms_per_row_token": budget[half]["step_ms"],
        "overhead_pct": projection[half]["overhead_pct"],
    }
    return {"model_id": engine.info.id, "probes": len(armed), **projection, "running_batch": running}


def cost_refusal(projection: dict[str, Any]) -> GateRefused:
    return GateRefused("cost", "PROBE_COST_BUDGET_EXCEEDED", costs.over_message(projection), cost=projection)


def _in_force(limits: dict[str, Any]) -> dict[str, Any]:
    """``in_force`` of stored limits, and why not (decision D83: an approval before 2026-10-29)."""
    reason = costs.not_in_force(limits)
    return {"in_force": reason is None, "not_in_force_reason": reason}


def _limits_in_force(settings: Any, budget: dict[str, Any], limits: dict[str, Any] | None) -> dict[str, Any]:
    if costs.not_in_force(limits):
        limits = None  # superseded (stored_limits says why): the settings are in force
    who = {"set_by": (limits or {}).get("set_by"), "set_at": (limits or {}).get("set_at")}
    pct_from_limits = budget["slowdown_budget_pct_source"] != "setting PROBE_SLOWDOWN_BUDGET_PCT"
    in_force: dict[str, Any] = {
        "slowdown_budget_pct": {
            "value": budget["slowdown_budget_pct"],
            "source": budget["slowdown_budget_pct_source"],
            **(who if pct_from_limits else {"set_by": None, "set_at": None}),
        },
        "headroom": {"value": budget["headroom"], "source": "setting PROBE_BUDGET_HEADROOM"},
        "max_armed": {"value": settings["PROBE_MAX_ARMED"], "source": "setting PROBE_MAX_ARMED"},
        "behaviours": {"value": None, "source": "none: as many probes arm as fit the budget (D83)"},
    }
    for half in budget["halves"]:
        source = budget[half]["source"]
        in_force[f"{half}_ms"] = {
            "value": round(budget[half]["budget_ms"], 6),
            "fillable": round(budget[half]["fillable_ms"], 6),
            "source": f"setting {budget[half]['setting']}" if source == "fallback" else source,
            **(who if source == "override" else {"set_by": None, "set_at": None}),
        }
    return in_force


def _capacity(runtime: Runtime, model_id: str) -> dict[str, Any]:
    info = resident_info(runtime, model_id)
    settings = runtime.settings
    measurement, limits = store.read(runtime.host.db, model_id)
    budget = costs.budget(settings, measurement, limits, info)
    stale = costs.stale_fields(measurement, info)
    armed = [a.view for a in runtime.snapshot.armed] if info is not None else []
    return {
        "object": "probe.capacity",
        "model_id": model_id,
        "loaded": info is not None,
        "measured": measurement is not None,
        "measuring": model_id in runtime.measuring,  # a measurement is in progress in this process
        "measurement": measurement,
        "stale": bool(stale) if stale is not None else None,
        "stale_fields": stale or [],
        "fallback": None
        if budget["measured"]
        else {
            "per_token_ms": settings["PROBE_MAX_OVERHEAD_MS_PER_PASS"],
            "per_1k_prompt_ms": settings["PROBE_MAX_PREFILL_MS_PER_1K"],
            "why": "measured, but stale" if stale else "not measured",
        },
        "budget": {k: v for k, v in budget.items() if k != "units"},
        "unit_costs": budget["units"],
        "recommendation": costs.recommendation(settings, measurement),
        "limits": _limits_in_force(settings, budget, limits),
        "stored_limits": None if limits is None else {**limits, **_in_force(limits)},
        "armed": costs.project(budget, armed) | {"probes": len(armed)},
        "checked_at": now_iso(),
    }


async def get_capacity(runtime: Runtime, model_id: str) -> dict[str, Any]:
    return await asyncio.to_thread(_capacity, runtime, model_id)


async def measure_model(runtime: Runtime, model_id: str) -> dict[str, Any]:
    """Time the model and its probes; needs it loaded and nothing armed (it uses the card)."""
    host = runtime.host
    async with runtime.lock:  # nothing arms while the card is being timed
        info = await asyncio.to_thread(resident_info, runtime, model_id)
        if info is None:
            raise ModelNotResident(f"the model {model_id!r} is not loaded; load it to measure it", param="model_id")
        if runtime.snapshot.armed:
            raise ProbeArmed(
                f"{len(runtime.snapshot.armed)} probe(s) are armed; disarm them to measure (they would be timed too)",
                param="model_id",
            )
        engine = host.resident_engine()
        assert engine is not None  # resident_info found it
        if not engine.hook_points:
            raise ModelNotResident("this engine exposes no layers to hook (probes cannot run on it)", param="model_id")
        stop = Stop(host, engine, runtime.settings["PROBE_MEASURE_TIMEOUT_S"])
        runtime.measuring[model_id] = stop
        try:
            reason = f"timing {model_id!r} and its probes' costs (probe capacity; serving goes on)"
            with admin_activity(host, "measuring", reason):  # /api/health says so while it runs
                async with host.engine_slot(model_id) as slot:
                    if slot.engine is not engine:
                        raise ModelBusy("the model changed while measuring started; retry", param="model_id")
                    measurement = await slot.run(measure, engine, model_id, host, stop)
        finally:
            runtime.measuring.pop(model_id, None)
        await asyncio.to_thread(store.write, host.db, model_id, measurement=measurement)
    return await get_capacity(runtime, model_id)


class NotMeasuring(MillmError):
    status, code = 404, "PROBE_CAPACITY_NOT_MEASURING"


async def cancel_measure(runtime: Runtime, model_id: str) -> dict[str, Any]:
    """Stop ``model_id``'s measurement in progress at its next run (it answers 409, stores nothing)."""
    await asyncio.to_thread(runtime.host.model_detail, model_id)  # 404 for an unknown model
    stop = runtime.measuring.get(model_id)
    if stop is None:
        raise NotMeasuring(f"no measurement of {model_id!r} is in progress in this process", param="model_id")
    stop.cancelled.set()
    return {"object": "probe.capacity_measure_cancel", "model_id": model_id, "cancelled": True}


async def put_limits(runtime: Runtime, model_id: str, body: dict[str, Any]) -> dict[str, Any]:
    request = validate(LimitsRequest, body)
    db = runtime.host.db
    async with runtime.lock:
        await asyncio.to_thread(runtime.host.model_detail, model_id)  # 404 for an unknown model
        measurement, _ = await asyncio.to_thread(store.read, db, model_id)
        limits: dict[str, Any] | None
        if request.action == "clear":
            limits = None
        elif request.action == "approve":
            recommendation = costs.recommendation(runtime.settings, measurement)
            if recommendation is None:
                raise NotMeasured("measure the model before approving its recommendation", param="action")
            if recommendation["digest"] != request.recommendation_digest:
                raise RecommendationChanged(
                    "the recommendation changed since you read it; read it again and approve what you see",
                    param="recommendation_digest",
                )
            limits = {"mode": "approved", "pct": recommendation["slowdown_budget_pct"]}
            limits["recommendation_digest"] = recommendation["digest"]
        else:
            limits = {"mode": "override", "pct": request.pct}
            limits["ms_per_token"], limits["ms_per_1k_prompt"] = request.ms_per_token, request.ms_per_1k_prompt
        if limits is not None:
            limits.update(set_by=request.set_by or "api", set_at=now_iso())
        await asyncio.to_thread(store.write, db, model_id, limits=limits)
    return await get_capacity(runtime, model_id)
