"""One request's steering: its fields checked, its hooks built, its headers and body extras.

``validate`` runs before any load, ``recheck`` once the model is resident (the
last point for a 400, before a stream's 200), ``hooks`` on the engine thread
when generation starts and ``finish`` after it. Everything the request needs
between them lives in ``ctx.state["steering"]``.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millm_host.api import FieldNotHonoured, InvalidParameter, LayerHook

from . import activations
from .activations import ActivationReader, ActivationsRequest
from .errors import SAENotAttached
from .features import Features, check_indices, non_negative_int, parse_features
from .header import intensity_value, rung_value, steering_value, unknown_value
from .intensity import Dial, Dialing, Limits, parse_dial
from .plan import Plan
from .resolve import Served, check_profile, inline_entries, profile_lam, select_attachment, serve
from .state import Profile, Snapshot

if TYPE_CHECKING:
    from millm_host.api import RequestContext

    from .service import SteeringService

log = logging.getLogger("millm.steering")

STATE_KEY = "steering"
GENERATION_ENDPOINTS = frozenset({"chat.completions", "completions"})
FIELDS = ("profile", "steering_intensity", "steering", "return_sae_activations")


@dataclass(frozen=True)
class InlineSet:
    """A request's own feature set (``steering``); empty features mean explicitly unsteered."""

    sae_id: str | None
    layer: int | None
    features: Features


@dataclass
class RequestSteering:
    """Per-request state, from validation to the response."""

    profile: Profile | None = None
    dial: Dial | None = None
    dialing: Dialing = Dialing(None, Limits())  # the dial with the server's limits: λ per base
    inline: InlineSet | None = None
    activations: ActivationsRequest | None = None
    echo: str | None = None  # X-miLLM-Steering-Intensity, settled before generation
    rung: str | None = None  # X-miLLM-Circuit-Rung: before generation (streams), then after it
    plan: Plan | None = None
    reader: ActivationReader | None = None
    header: str | None = None  # X-miLLM-Steering, settled after generation
    millm: dict[str, Any] | None = None


def parse_inline(value: Any) -> InlineSet:
    if not isinstance(value, dict):
        raise InvalidParameter("steering must be an object with features (and optionally sae_id)", param="steering")
    if value.get("features") is None:
        raise InvalidParameter(
            "steering.features is required ([] means explicitly unsteered)", param="steering.features"
        )
    features = parse_features(value["features"], "steering.features", strict_keys=False)
    sae_id, layer = value.get("sae_id"), value.get("layer")
    if sae_id is not None and not isinstance(sae_id, str):
        raise InvalidParameter("steering.sae_id must be a string", param="steering.sae_id")
    if layer is not None:
        non_negative_int(layer, "steering.layer")
    if not features and (sae_id is not None or layer is not None):
        raise InvalidParameter(
            "steering.features is empty (explicitly unsteered): it takes no sae_id or layer",
            param="steering.sae_id" if sae_id is not None else "steering.layer",
        )
    return InlineSet(sae_id, layer, features)


def _sent(ctx: RequestContext) -> list[str]:
    return [f for f in FIELDS if ctx.body.get(f) is not None and ctx.body.get(f) is not False]


def validate(ctx: RequestContext, service: SteeringService) -> None:
    """Check the request's steering fields before any model load (``validate_request``)."""
    if ctx.endpoint not in GENERATION_ENDPOINTS:
        return
    sent = _sent(ctx)
    if not sent:
        return
    steering_sent = [f for f in sent if f != activations.PARAM]
    if ctx.scoring and steering_sent:  # activations are read on scoring requests, unsteered
        raise FieldNotHonoured(
            f"{steering_sent[0]} cannot be used on a scoring request: scoring is always unsteered",
            param=steering_sent[0],
        )
    body = ctx.body
    for other in ("profile", "steering_intensity"):
        if "steering" in sent and other in sent:
            raise InvalidParameter(
                f"steering and {other} are mutually exclusive: send one of them", param=f"steering, {other}"
            )
    dial = parse_dial(body.get("steering_intensity"))
    req = RequestSteering(dial=dial, dialing=Dialing(dial, service.limits()))
    if "profile" in sent:
        name = body["profile"]
        if not isinstance(name, str) or not name:
            raise InvalidParameter("profile must be a profile name", param="profile")
        req.profile = service.store.load_profile(name)
    if "steering" in sent:
        req.inline = parse_inline(body["steering"])
    req.activations = activations.parse(body.get("return_sae_activations"), ctx.settings["SAE_ACTIVATIONS_MAX_TOP_K"])
    if req.activations is not None:
        activations.check_request_shape(ctx)
        for sae_id in {a.sae_id for a in service.state.snapshot().attached()}:
            service.labels.warm(sae_id)  # the labels its reader reports (label_cache.py)
    if service.is_resident(ctx.model.id):
        _check(service.state.snapshot(), req)
    else:  # SAEs only ever attach to the resident model: refuse before an auto-load would evict it
        needs_sae = (
            "steering"
            if req.inline is not None and req.inline.features
            else (activations.PARAM if req.activations is not None else None)
        )
        if needs_sae is not None:
            raise SAENotAttached(f"no SAE is attached to model {ctx.model.id!r}: it is not resident", param=needs_sae)
    ctx.state[STATE_KEY] = req


def _check(snap: Snapshot, req: RequestSteering) -> None:
    """Refuse what the attached SAEs cannot serve."""
    if req.inline is not None and req.inline.features:
        _inline_attachment(snap, req.inline)
    if req.profile is not None and profile_lam(req.profile, req.dialing) != 0.0:  # off: the base is not checked
        check_profile(snap, req.profile)
    if req.activations is not None:
        activations.select(snap, req.activations)


def _inline_attachment(snap: Snapshot, inline: InlineSet):
    attachment = select_attachment(snap, inline.sae_id, inline.layer, "steering")
    check_indices(
        [i for i, _ in inline.features],
        attachment.sae.cfg.d_sae,
        attachment.sae_id,
        lambda j: f"steering.features[{j}].index",
    )
    return attachment


def recheck(ctx: RequestContext, service: SteeringService) -> None:
    """The model is resident and the prompts tokenized (``after_tokenize``): check again, settle the echo."""
    req = ctx.state.get(STATE_KEY)
    snap = service.state.snapshot()
    if req is None:
        if ctx.endpoint not in GENERATION_ENDPOINTS or ctx.scoring or not snap.circuits:
            return
        req = ctx.state[STATE_KEY] = RequestSteering(dialing=Dialing(None, service.limits()))  # for the rung
    _check(snap, req)
    if req.activations is not None:
        if ctx.scoring:
            generated = 0  # scoring generates nothing
        else:
            assert ctx.sampling is not None  # a generation's, settled before after_tokenize
            generated = ctx.sampling.max_tokens
        worst = activations.worst_case_entries(req.activations, len(ctx.prompts[0]), generated)
        limit = ctx.settings["SAE_ACTIVATIONS_MAX_ENTRIES"]
        if worst > limit:
            raise InvalidParameter(
                f"return_sae_activations could return up to {worst} entries (positions × top_k, counting "
                f"max_tokens in full); SAE_ACTIVATIONS_MAX_ENTRIES is {limit}: narrow positions or lower top_k",
                param=activations.PARAM,
            )
    if req.dial is not None:
        lam = _echoed_lam(snap, req)
        req.echo = None if lam is None else intensity_value(lam)
    if req.inline is None:
        served = serve(snap, req.dialing, req.profile)
        req.rung = None if served.problem else rung_value(served.entries)


def _echoed_lam(snap: Snapshot, req: RequestSteering) -> float | None:
    """λ of what the dial scales: the request's or active profile, else the live values, else the
    first active circuit with an attached member; None when the dial changes nothing."""
    profile = req.profile if req.profile is not None else snap.active
    if profile is not None and profile.key in snap.attachments:
        return profile_lam(profile, req.dialing)
    if req.profile is None and any(snap.live_manual(key) for key in snap.manual):
        return req.dialing.plain()
    for circuit_id in sorted(snap.circuits):
        active = snap.circuits[circuit_id]
        if any(m.key in snap.attachments for m in active.doc.members):
            return req.dialing.circuit(active.doc.intensity_range, active.dial)
    return None


def hooks(ctx: RequestContext, service: SteeringService) -> list[LayerHook] | None:
    """Build the request's plan and hooks (``before_forward``, engine thread: generation only)."""
    req = ctx.state.setdefault(STATE_KEY, RequestSteering(dialing=Dialing(None, service.limits())))
    engine = ctx.engine
    assert engine is not None  # before_forward runs with the model resident
    snap = service.state.snapshot()
    if snap.model_load_id != engine.info.load_id:
        snap = Snapshot(snap.epoch, {}, {}, snap.active, snap.model_load_id)  # state of another model
    if not snap.attachments and req.inline is None and req.activations is None:
        req.plan = Plan(service.state, snap, Served(), None)  # nothing attached: nothing to steer
        return None
    from .sae import model_dtype

    dtype = model_dtype(engine.info.dtype)
    refresh = None
    if req.inline is not None:  # replaces every other steering, circuits included
        served = Served(
            inline_entries(_inline_attachment(snap, req.inline), req.inline.features) if req.inline.features else []
        )
    elif req.profile is not None:  # frozen: its own profile, beside the active circuits
        if profile_lam(req.profile, req.dialing) != 0.0:
            check_profile(snap, req.profile)
        served = serve(snap, req.dialing, req.profile)
    else:
        served = serve(snap, req.dialing)
        if req.dial is None or not req.dial.is_off:  # live: re-read the state when the epoch moves
            refresh = functools.partial(serve, dialing=req.dialing)
    req.plan = Plan(service.state, snap, served, dtype, refresh)
    installed = req.plan.hooks()
    if req.activations is not None:
        req.reader = _reader(snap, req.activations, len(ctx.prompts[0]), service)
        installed.append(req.reader.hook())
    return installed or None


def scoring_hooks(ctx: RequestContext, service: SteeringService) -> list[LayerHook] | None:
    """The activation read hook of a scoring request (``before_scoring``): unsteered by construction."""
    req = ctx.state.get(STATE_KEY)
    if req is None or req.activations is None:
        return None
    snap = service.state.snapshot()
    req.reader = _reader(snap, req.activations, len(ctx.prompts[0]), service)
    return [req.reader.hook()]


def _reader(snap: Snapshot, request: ActivationsRequest, prompt_len: int, service: SteeringService) -> ActivationReader:
    """The activation reader of a request, with its SAE's labels as validation read them."""
    attachment = activations.select(snap, request)
    return ActivationReader(attachment, request, prompt_len, service.labels.get(attachment.sae_id))


def scoring_activations(ctx: RequestContext) -> dict[str, Any] | None:
    """The ``millm`` object of a scoring response: activations of the prompt, read unsteered."""
    req = ctx.state.get(STATE_KEY)
    if req is None or req.reader is None or not ctx.prompts:
        return None
    return req.reader.payload(ctx.prompts[0], read_point=activations.UNSTEERED)


def finish(ctx: RequestContext) -> None:
    """Generation ended (``after_generate``): settle the header and the activations."""
    req = ctx.state.get(STATE_KEY)
    if req is None or req.plan is None:
        return
    try:
        applied, changed = req.plan.applied(), req.plan.changed()
        if req.plan.problem is not None:
            req.header, req.rung = unknown_value(req.plan.problem, changed), None
        else:
            req.header, req.rung = steering_value(applied, changed), rung_value(applied)
        if ctx.host is not None:
            steered = ctx.host.metrics.counter(
                "millm_steering", "Steering applied to generations, by kind (profile, inline, manual)", ("kind",)
            )
            for entry in applied:
                steered.inc(kind=entry.kind)
    except Exception:
        log.exception("reading the applied steering failed")
        req.header, req.rung = unknown_value("read_failed"), None
    if req.reader is not None and ctx.outputs:
        out = ctx.outputs[0]
        req.millm = req.reader.payload(out.prompt_ids + out.token_ids)


def header(ctx: RequestContext) -> str:
    """The X-miLLM-Steering value: what the hooks applied (``none`` when nothing ran)."""
    req = ctx.state.get(STATE_KEY)
    return req.header if req is not None and req.header is not None else steering_value([], False)
