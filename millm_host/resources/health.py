"""``GET /api/health`` (whether generation routes serve now, and why not), the load balancer's two
questions (``/api/health/live`` and ``/api/health/ready``), and ``/api/health/inference``: how
generations are being run. ``GET /health`` and ``GET /ping`` answer as ``/api/health/live``: the paths
vLLM-style load balancers, Kubernetes examples and benchmark tools (guidellm) probe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field

from ..errors import SERVER_ERROR, MillmError
from ..openapi import operation
from ..protocol import ResponseModel
from ..registry import ModelState
from ..response_bodies import Health as HealthBody

if TYPE_CHECKING:
    from ..engine import EngineSpec
    from ..intake import IntakeGate
    from ..registry import ModelEntry, ModelRegistry
    from ..replicas.convergence import Convergence
    from ..scheduler import Scheduler


class HealthHost(Protocol):
    """What the health routes use of the host."""

    registry: ModelRegistry
    scheduler: Scheduler
    intake: IntakeGate
    convergence: Convergence
    engines: list[EngineSpec]
    report: Any


class NotReady(MillmError):
    status, code, type = 503, "not_ready", SERVER_ERROR


class Live(ResponseModel):
    """``GET /api/health/live``: the process answers."""

    status: Literal["live"]


class Ready(ResponseModel):
    """``GET /api/health/ready``: this replica takes requests."""

    status: Literal["ready"]
    model: str = Field(description="The resident model")
    replica: str = Field(description="This replica's id (MILLM_REPLICA_ID, or host:port:pid)")


class PrefixCacheReport(ResponseModel):
    """What the engine's prefix cache holds and how often it served, since the model loaded."""

    capacity_bytes: int = Field(description="Its bound (MILLM_PREFIX_CACHE_MB)")
    used_bytes: int = Field(description="What the prompts it keeps take")
    entries: int = Field(description="Prompts it keeps")
    hits: int = Field(description="Requests that reused a prompt prefix")
    misses: int = Field(description="Requests that found none to reuse")
    hit_tokens: int = Field(description="Prompt tokens reused instead of computed")
    evictions: int = Field(description="Prompts dropped, least recently used first, to stay within the bound")


class Inference(ResponseModel):
    """``GET /api/health/inference``: the generation backend of the resident model, its batch and queue."""

    model: str | None = Field(description="The resident model (None: none is loaded)")
    backend: Literal["serial", "continuous"] = Field(
        description="serial: one generation at a time; continuous: generations share decode steps"
    )
    batching_unavailable: str | None = Field(
        default=None, description="Why MILLM_BATCHING=continuous could not batch this model (it runs serial)"
    )
    max_rows: int = Field(default=1, description="The most generations decoding at once")
    running: int = Field(description="Generations running now (in the batch, prefilling, or alone)")
    waiting: int = Field(description="Admitted requests not yet generating (queued for the engine or the batch)")
    admitted: int = Field(description="Admitted requests, waiting or running")
    batched: int = Field(default=0, description="Generations that entered the batch since the model loaded")
    left_waiting: int = Field(
        default=0,
        description="Generations cancelled (their client gone) before they entered the batch, since the model loaded",
    )
    steps: int | None = Field(default=None, description="Batched decode steps run since the model loaded")
    intake_charged: int = Field(
        default=0,
        description="Requests whose client left before their answer, each charged its intake: while a generation "
        "runs, new requests then wait at the intake gate (MILLM_INTAKE_SHARE), since the server started",
    )
    intake_paced: int = Field(default=0, description="Requests that found the intake gate closed and waited")
    intake_left: int = Field(
        default=0,
        description="Requests whose client left while they waited at the intake gate (they cost nothing more)",
    )
    serial_reasons: dict[str, int] = Field(
        default_factory=dict,
        description="Generations that ran alone while batching was on, counted by why (probe_force_serial: armed probes with PROBE_FORCE_SERIAL)",
    )
    prefix_cache: PrefixCacheReport | None = Field(
        default=None, description="The engine's prefix cache (None: it has none, or it is off: MILLM_PREFIX_CACHE_MB=0)"
    )


def inference_report(host: HealthHost) -> dict[str, Any]:
    """The body of ``GET /api/health/inference``."""
    registry, scheduler = host.registry, host.scheduler
    engine = registry.engine
    report: dict[str, Any] = dict(engine.inference()) if engine is not None else {"backend": "serial"}
    running = scheduler.generations
    batch_waiting = report.pop("waiting", None) or 0
    return {
        "model": registry.resident.id if registry.resident is not None else None,
        "backend": report.get("backend", "serial"),
        "batching_unavailable": report.get("batching_unavailable"),
        "max_rows": report.get("max_rows", 1),
        "running": running - batch_waiting,
        "waiting": max(0, scheduler.admitted - running) + batch_waiting,
        "admitted": scheduler.admitted,
        "batched": report.get("batched", 0),
        "left_waiting": report.get("left_waiting", 0),
        "steps": report.get("steps"),
        "intake_charged": host.intake.charged,
        "intake_paced": host.intake.paced,
        "intake_left": host.intake.left,
        "serial_reasons": dict(report.get("serial_reasons", {})),
        "prefix_cache": report.get("prefix_cache"),
    }


@dataclass
class ServingState:
    """What ``GET /api/health`` says of serving: its ``status``, about which model, and why."""

    status: str
    entry: ModelEntry | None = None
    reason: str | None = None
    #: The model's own phase: loading, unloading, failed, or loaded (None without a model).
    phase: str | None = "loaded"
    progress: str | None = None
    error: str | None = None


def serving_state(host: HealthHost) -> ServingState:
    """The first that holds: shutting down, a load or an unload, no model (or the start model failed),
    a degraded engine or a stalled generation, admin work (``registry.activity``); else ok."""
    registry, scheduler = host.registry, host.scheduler
    if scheduler.closing:
        entry = registry.resident
        reason = "the server is shutting down; new requests get 503 shutting_down"
        return ServingState("shutting_down", entry, reason, phase="loaded" if entry else None)
    if registry._transition is not None:
        kind, entry, _ = registry._transition
        if kind == "load":
            reason = f"model {entry.id!r} is loading; requests for other models get 503 model_busy"
            return ServingState("loading", entry, reason, phase="loading", progress=entry.progress)
        reason = (
            f"model {entry.id!r} is unloading ({registry._leases} requests still running); "
            "every generation route answers 503 model_busy until it ends"
        )
        return ServingState("unloading", entry, reason, phase="unloading", progress=entry.progress)
    entry = registry.resident
    if entry is None or registry.engine is None:
        start = registry.start_model
        if start is not None and start.state is ModelState.FAILED:
            reason = f"the start model failed to load: {start.error}"
            return ServingState("failed", start, reason, phase="failed", error=start.error)
        return ServingState("no_model", None, "no model is loaded", phase=None)
    engine_state = registry.engine.status().get("state")
    if engine_state in ("failed", "closed", "restarting"):
        return ServingState("degraded", entry, f"the engine is {engine_state}; requests fail or wait until it is back")
    if scheduler.stalled():
        reason = (
            f"a generation made no progress for {scheduler.stalled_for():.0f} s "
            f"(MILLM_GENERATION_STALL_S={scheduler.stall_s:g}); requests behind it get 503 generation_stalled"
        )
        return ServingState("degraded", entry, reason)
    if registry.activities:
        work = registry.activities[0]
        refusing = "; generation routes answer 503 model_busy meanwhile" if work.refuses else ""
        return ServingState(work.kind, entry, work.reason + refusing)
    return ServingState("ok", entry)


class Health:
    def __init__(self, host: HealthHost) -> None:
        self.host = host

    @operation("The server's state: the model, its load, the queue, the plugins", response=HealthBody)
    async def on_get(self, req, resp) -> None:
        registry = self.host.registry
        scheduler = self.host.scheduler
        report = self.host.report
        state = serving_state(self.host)
        entry = state.entry
        resp.media = {
            "status": state.status,
            "reason": state.reason,
            # The model the status is about: the resident one, the one loading, or the start model that failed.
            "model": entry.id if entry else None,
            "engine": entry.spec.name if entry else None,
            "phase": state.phase,
            "progress": state.progress,
            "error": state.error,
            "engine_status": dict(registry.engine.status()) if registry.engine is not None else None,
            "engines": [spec.name for spec in self.host.engines],
            "plugins": [{"name": r.name, "version": r.version} for r in report.loaded],
            "failed_plugins": [{"name": r.name, "error": r.error} for r in report.failed],
            "queue": {
                "admitted": scheduler.admitted,
                "max_waiting": scheduler.queue_max,
                "generating": scheduler.generating,
                "stalled": scheduler.stalled(),
                "shutting_down": scheduler.closing,
            },
            # Whether this replica has reached the desired state in the database, and why not.
            "replica": self.host.convergence.report(),
        }

    @operation(
        "How generations run: the backend (serial or continuous batching), its batch, and why any ran alone",
        response=Inference,
    )
    async def on_get_inference(self, req, resp) -> None:
        resp.media = inference_report(self.host)

    @operation("Liveness: the server answers (for a load balancer or an orchestrator)", response=Live)
    async def on_get_live(self, req, resp) -> None:
        resp.media = {"status": "live"}

    @operation("Liveness, as GET /api/health/live: the path vLLM, llama.cpp and load balancers probe", response=Live)
    async def on_get_alias(self, req, resp) -> None:
        await self.on_get_live(req, resp)

    @operation(
        "Readiness: a model is loaded, the replica has converged and is not draining (503 not_ready otherwise)",
        response=Ready,
        errors=(503,),
    )
    async def on_get_ready(self, req, resp) -> None:
        model = ready_model(self.host)
        reasons = await self.host.convergence.current()
        if reasons:
            raise NotReady("this replica has not converged to the desired state: " + "; ".join(reasons))
        resp.media = {"status": "ready", "model": model, "replica": self.host.convergence.replica_id}


def ready_model(host: HealthHost) -> str:
    """The resident model's id when this server takes requests; ``503 not_ready`` saying why not."""
    registry = host.registry
    if host.scheduler.closing:
        raise NotReady("the server is shutting down (draining its requests)")
    if registry._transition is not None:
        kind, entry = registry._transition[0], registry._transition[1]
        raise NotReady(f"model {entry.id!r} is {kind}ing")
    if registry.resident is None or registry.engine is None:
        raise NotReady("no model is loaded")
    state = registry.engine.status().get("state")
    if state in ("failed", "closed", "restarting"):
        raise NotReady(f"the engine is {state}")
    return registry.resident.id
