"""Live monitoring: the request-path half of the plugin.

``validate_request`` settles the request's session (``settle``); ``before_forward``
snapshots what is armed and returns one read hook per residual point (none at all
when nothing is armed, or when the request cannot be scored); the hooks gather
rows on the device; ``after_generate`` scores every probe and window once, stores
the results and renders them for the header, the body field and the stream chunk.

Each step's time is kept in the request's ``last_request`` report (GET
/api/probes/status): the session, the capture's set-up, the read hooks (the
prompt's pass apart from the generated tokens' passes), the scoring and the
recording, each in wall time and the part of it the working thread spent on the
CPU. ``measure`` times a private set through these same functions, so the cost
model prices what this reports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, Field

from millm_host.api import (
    ORDER_PROBE_VERDICTS,
    ORDER_READ_POST_STEERING,
    ORDER_READ_PRE_STEERING,
    STEERED,
    UNSTEERED,
    InvalidParameter,
    LayerHook,
    MonitoredRequest,
    RequestContext,
    ResponseExtra,
    WindowText,
    hooks_for,
    monitor_results,
)

from .. import store
from ..results import Reading, Served, Trace, behaviour_sets, listing, result_object
from ..runtime import Runtime, Snapshot
from ..scoring.bank import Point
from ..scoring.capture import OWNER, Capture
from ..scoring.evaluate import detail, forward_columns, read_pairs
from ..scoring.windows import Layout, NotScored, measure, window_span
from ..sessions import turns
from . import header
from .trace import new_trace

log = logging.getLogger("millm.probes")

STATE = "probes"
BODY_FIELD = "millm_probe_verdicts"
#: The request field that asks for each result's per-token scores (``token_scores``), and where it is read.
TOKEN_SCORES_FIELD = "probe_token_scores"
TOKEN_SCORES_ENDPOINTS = ("chat.completions", "completions")


class ProbeFields(BaseModel):
    """The probes' request fields on chat and text completions, for ``/openapi.json``."""

    probe_token_scores: bool | None = Field(
        default=None,
        description="miLLM's: each live probe result in millm_probe_verdicts carries token_scores, "
        "{positions, scores}: the per-token scores over its window, at absolute positions (prompt then "
        "generated tokens, as return_sae_activations counts them)",
    )


_UNSEEN = object()  # before_forward never ran for this request


@dataclass
class LiveRequest:
    """One monitored request's probe state (``ctx.state["probes"]``)."""

    snapshot: Snapshot
    trace: Trace
    execution_mode: str
    skip: str | None = None  # why the whole request is not scored
    capture: Capture | None = None
    #: with_unsteered: the unsteered reply's rows (``capture`` holds the steered reply's).
    unsteered: Capture | None = None
    began: float = field(default_factory=time.perf_counter)
    began_cpu: float = field(default_factory=time.thread_time)
    setup_seconds: float = 0.0
    setup_cpu_seconds: float = 0.0
    unsteered_seconds: float = 0.0  # the pass that read the unsteered residual, when steering wrote upstream
    results: list[dict[str, Any]] | None = None  # the steered reply's (its first choice's)
    #: with_unsteered: each reply's results, by variant (``results`` is the steered one's).
    variants: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    header: str | None = None  # X-miLLM-Probe-Verdicts, rendered with the results


def wants_token_scores(ctx: RequestContext) -> bool:
    """Whether the request asked for each result's per-token scores (``probe_token_scores``); a value
    that is not a boolean is refused (``validate_request``)."""
    value = ctx.body.get(TOKEN_SCORES_FIELD)
    if value is not None and not isinstance(value, bool):
        raise InvalidParameter(f"{TOKEN_SCORES_FIELD} must be true or false", param=TOKEN_SCORES_FIELD)
    return bool(value)


SETTLED = "probes_settled"  # ctx.state: (wall, CPU) seconds the session took to settle (validate_request)


def settle(runtime: Runtime, ctx: RequestContext) -> None:
    """While a probe is armed, the session a monitored request joins (``validate_request``, a worker thread:
    it may read the database), timed as part of the request's probe work."""
    began, cpu = time.perf_counter(), time.thread_time()
    if not runtime.settings["PROBE_SESSIONS"]:  # monitored, in no session: nothing looked up or recorded
        ctx.state[turns.UNGROUPED] = True
    else:
        ctx.state[turns.STATE] = turns.settle(runtime.host.db, runtime.settings, ctx)
    ctx.state[SETTLED] = (time.perf_counter() - began, time.thread_time() - cpu)


def _skip_reason(ctx: RequestContext, batched: bool) -> str | None:
    if ctx.headers.get("x-millm-origin", "").strip().lower() == "judge":
        return "judge_traffic"
    if ctx.engine is None or not ctx.engine.hook_points:
        return "engine_unsupported"
    if ctx.adapter is not None:  # a probe's identity is a base model's: an adapted one is another model
        return "adapter_not_in_identity"
    if batched:
        return "batched_request"
    return None


def begin(runtime: Runtime, ctx: RequestContext) -> list[LayerHook] | None:
    """Claim the armed probes' layers for this request; None when there is nothing to read."""
    snapshot = runtime.snapshot
    if not snapshot.armed:
        ctx.state[STATE] = None  # seen, and nothing was armed
        return None
    batched = len(ctx.prompts) > 1 or ctx.n > 1
    request = LiveRequest(snapshot, new_trace(ctx.headers), "batched" if batched else "serial")
    request.skip = _skip_reason(ctx, batched)
    ctx.state[STATE] = request
    if request.skip is not None:
        return None
    assert ctx.sampling is not None  # before_forward: a generation, its sampling settled
    assert snapshot.bank is not None  # built whenever probes are armed
    capacity = len(ctx.prompts[0]) + ctx.sampling.max_tokens
    request.capture = Capture(snapshot.bank.points, capacity)
    hooks = request.capture.hooks()
    if ctx.with_unsteered:  # each reply read by its own hooks, on its own rows
        hooks = [replace(hook, variant=STEERED) for hook in hooks]
        request.unsteered = Capture(snapshot.bank.points, capacity)
        hooks += [replace(hook, variant=UNSTEERED) for hook in request.unsteered.hooks()]
    request.setup_seconds = time.perf_counter() - request.began
    request.setup_cpu_seconds = time.thread_time() - request.began_cpu
    return hooks


def _site(layer: int, point: str) -> int:
    """Where a hook point sits in the forward pass, in order: a layer's input, then its output."""
    return 2 * layer + (point == "resid_post")


def writes_upstream(hooks: Sequence[LayerHook], points: Iterable[Point]) -> bool:
    """Whether another plugin's hook writes the residual before one of ``points`` in the pass: at an
    earlier layer, or at a layer's input under a read of its output. At a read's own point the probes
    read first (``ORDER_READ_PRE_STEERING``)."""
    writes = [
        _site(hook.layer, hook.point)
        for hook in hooks
        if hook.owner != OWNER and ORDER_READ_PRE_STEERING < hook.order < ORDER_READ_POST_STEERING
    ]
    return bool(writes) and any(_site(layer, point) > min(writes) for layer, point in points)


def _served_as(request: LiveRequest, capture: Capture | None) -> tuple[str, int | None]:
    """How a request's passes really ran, as its capture saw them: ``continuous`` with the most
    sequences one pass held when they were a continuous batch's, ``serial`` (batch size 1) when
    they ran alone. A request with no capture keeps what ``begin`` knew (``serial``, or
    ``batched`` for several prompts or choices), with no batch size."""
    if capture is None or not capture.passes:
        return request.execution_mode, None
    if capture.batch_rows:
        return "continuous", capture.batch_rows
    return "serial", 1


def _read(
    ctx: RequestContext, request: LiveRequest, runtime: Runtime, capture: Capture | None, choice: int, variant: str
) -> tuple[list[Reading], Layout | None, list[int], int]:
    """One reply's readings (choice ``choice``, read by ``capture``), its layout, its ids (prompt then
    generated) and the device-to-host copies it took."""
    snapshot = request.snapshot
    plan = snapshot.plan
    pairs = plan.pairs
    if request.skip is not None and not ctx.interrupted:
        return [Reading("skipped", request.skip) for _ in pairs], None, [], 0
    if capture is None:
        return (
            [Reading("interrupted", ctx.interrupted or "generation_error", "unavailable") for _ in pairs],
            None,
            [],
            0,
        )
    engine = ctx.engine
    prompt = ctx.prompts[0]
    ids = prompt + (ctx.outputs[choice].token_ids if len(ctx.outputs) > choice else [])
    layout = measure(
        engine,
        ids,
        capture.positions,
        prompt_len=len(prompt),
        prefix_ids=runtime.prefix_ids(engine) if plan.skip_prefix else None,
        conversation=ctx.conversations[0] if ctx.is_chat and ctx.conversations else None,
        no_turns="last_user_span_unknown" if ctx.is_chat else "text_completion_has_no_user_turn",
        tools=ctx.chat_tools,
        template_kwargs=ctx.chat_template_kwargs,
        need_last_user=plan.last_user,
        markers=ctx.reasoning.markers if ctx.reasoning is not None else None,  # a chat with a model that thinks
        need_reasoning=plan.reasoning,
    )
    columns = None
    copies = 0
    if capture.positions:
        assert snapshot.bank is not None  # a capture is made only with a bank
        if writes_upstream(hooks_for(ctx.layer_hooks, variant), snapshot.bank.points):
            # Another plugin (steering) wrote the residual before a point the probes read, so the
            # captured rows are steered: read the same tokens again, unsteered, in one forward pass
            # with the probes' read hooks alone (the stateless scoring's pass).
            began = time.perf_counter()
            try:
                columns = forward_columns(engine, snapshot.bank, ids[: capture.positions])
            except Exception:  # the model went away, memory: no steered score stands in for it
                log.exception("the unsteered pass of request %s failed", ctx.request_id)
                return [Reading("failed", "unsteered_pass_failed", "unavailable") for _ in pairs], layout, ids, 0
            finally:
                request.unsteered_seconds += time.perf_counter() - began
        else:
            columns = snapshot.bank.columns(capture.rows())
        copies = 1
    return read_pairs(pairs, snapshot.bank, columns, layout, interrupted=ctx.interrupted), layout, ids, copies


def finish(runtime: Runtime, ctx: RequestContext) -> None:
    """Score, store and keep the results of a monitored request (also an interrupted one)."""
    request = ctx.state.get(STATE, _UNSEEN)
    if request is None:
        return
    if request is _UNSEEN:  # before_forward never ran: the request failed before generation
        if not ctx.interrupted or not runtime.snapshot.armed:
            return
        request = ctx.state[STATE] = LiveRequest(runtime.snapshot, new_trace(ctx.headers), "serial")
    started, started_cpu = time.perf_counter(), time.thread_time()
    snapshot, capture = request.snapshot, request.capture
    token_scores = ctx.body.get(TOKEN_SCORES_FIELD) is True
    replies = [(STEERED, capture, 0)]
    if ctx.with_unsteered:  # each reply scored on its own tokens: the unsteered one's first choice follows the steered
        replies.append((UNSTEERED, request.unsteered, ctx.choices_per_variant))
    copies = 0
    scored: list[tuple[str, list[dict[str, Any]], list[dict[str, Any] | None]]] = []
    for variant, reply_capture, choice in replies:
        readings, layout, ids, copied = _read(ctx, request, runtime, reply_capture, choice, variant)
        copies += copied
        served = Served.of(ctx.engine, *_served_as(request, reply_capture))
        results = [
            result_object(
                view,
                window,
                reading,
                served,
                request.trace,
                ctx.request_id,
                "persisted",
                snapshot.sets.get(view.probe_id),
                token_scores=token_scores,
            )
            for (view, window), reading in zip(snapshot.plan.pairs, readings, strict=True)
        ]
        # Decoded context is text: kept only where a result fired (spec, Privacy), under transcript retention.
        details = [detail(ctx.engine, ids, reading) if ids and reading.verdict else None for reading in readings]
        others = monitor_results(ctx, _monitored(ctx, request, layout, ids))
        results += others
        details += [None] * len(others)
        order = listing(results)  # behaviour by behaviour: a behaviour's rule results beside its probes'
        results, details = [results[i] for i in order], [details[i] for i in order]
        if ctx.with_unsteered:
            for result in results:
                result["variant"] = variant
        scored.append((variant, results, details))
    results = [r for _, part, _ in scored for r in part]
    details = [d for _, _, part in scored for d in part]
    steered = scored[0][1]
    scored_at, scored_cpu = time.perf_counter(), time.thread_time()
    session_id, turn = turns.record_turn(runtime, ctx, request.trace.trace_id, steered)  # the reply as steered
    if runtime.tail is not None:  # before the rows can be read: the tail must know them for this process's
        runtime.tail.wrote(results)
    try:
        store.write_events(runtime.host.db, results, details, session_id, turn)
    except Exception:
        log.exception("storing %d probe results failed", len(results))
        for result in results:
            result["persistence"] = "not_persisted"
    request.results = steered
    if ctx.with_unsteered:
        request.variants = {variant: part for variant, part, _ in scored}
    if not ctx.streaming:  # a stream's headers went out before generation: it carries the results in its chunk
        request.header = header.render(steered, runtime.settings["PROBE_VERDICT_HEADER_MAX_BYTES"])
    runtime.feed.publish(results, request_id=ctx.request_id, endpoint=ctx.endpoint, session=session_id, turn=turn)
    done, done_cpu = time.perf_counter(), time.thread_time()
    settled, settled_cpu = ctx.state.get(SETTLED, (0.0, 0.0))
    hooks_s = capture.seconds if capture else 0.0
    prompt_hooks_s = capture.prompt_seconds if capture else 0.0
    hooks_cpu_s = capture.cpu_seconds if capture else 0.0
    prompt_hooks_cpu_s = capture.prompt_cpu_seconds if capture else 0.0
    request_s = settled + request.setup_seconds + (done - started)
    request_cpu_s = settled_cpu + request.setup_cpu_seconds + (done_cpu - started_cpu)
    overhead_s = request_s + hooks_s
    runtime.observe(ctx, results, overhead_s)
    ms = 1000.0
    runtime.record(
        steered,
        {
            "request_id": ctx.request_id,
            "overhead_ms": round(overhead_s * ms, 3),
            # what the request paid once (session, set-up, scoring, recording), apart from the hooks' passes
            "request_ms": round(request_s * ms, 3),
            "request_cpu_ms": round(request_cpu_s * ms, 3),
            "session_ms": round(settled * ms, 3),
            "setup_ms": round(request.setup_seconds * ms, 3),
            "hooks_ms": round(hooks_s * ms, 3),  # inside the read callbacks, every pass
            "hooks_prompt_ms": round(prompt_hooks_s * ms, 3),  # of which the prompt's pass
            "hooks_cpu_ms": round(hooks_cpu_s * ms, 3),
            "hooks_prompt_cpu_ms": round(prompt_hooks_cpu_s * ms, 3),
            "scoring_ms": round((scored_at - started) * ms, 3),
            # of which the unsteered pass over the request's tokens (0 unless steering wrote upstream of a read)
            "unsteered_pass_ms": round(request.unsteered_seconds * ms, 3),
            "scoring_cpu_ms": round((scored_cpu - started_cpu) * ms, 3),
            "recording_ms": round((done - scored_at) * ms, 3),
            "recording_cpu_ms": round((done_cpu - scored_cpu) * ms, 3),
            "forward_passes": capture.passes if capture else 0,
            "hooked_points": len(capture.points) if capture else 0,  # one read hook per point, for every probe
            "positions": capture.positions if capture else 0,
            "prompt_tokens": len(ctx.prompts[0]) if ctx.prompts else 0,
            "device_to_host_copies": copies,
            "results": len(results),
        },
    )


def _monitored(ctx: RequestContext, request: LiveRequest, layout: Layout | None, ids: list[int]) -> MonitoredRequest:
    """The request as other plugins' results see it (hook ``monitor_results``)."""

    def read_window(window: str) -> WindowText:
        if ctx.interrupted:
            return WindowText(None, "interrupted", ctx.interrupted, "unavailable")
        if request.skip is not None:
            return WindowText(None, "skipped", request.skip)
        return window_text(ctx.engine, ids, layout, window)

    return MonitoredRequest(
        behaviours=monitored_behaviours(request.snapshot.plan.pairs),
        request_id=ctx.request_id,
        trace_id=request.trace.trace_id,
        span_id=request.trace.span_id,
        skip=request.skip,
        interrupted=ctx.interrupted,
        read_window=read_window,
        host=ctx.host,
        sets=behaviour_sets(request.snapshot.plan.pairs, request.snapshot.sets),
    )


def monitored_behaviours(pairs: Any) -> dict[str, tuple[str, ...]]:
    """Each behaviour of the scored probes -> the windows they report, in listing order."""
    behaviours: dict[str, list[str]] = {}
    for view, window in pairs:
        if view.behaviour is not None and window not in behaviours.setdefault(view.behaviour, []):
            behaviours[view.behaviour].append(window)
    return {key: tuple(windows) for key, windows in behaviours.items()}


def window_text(engine: Any, ids: list[int], layout: Layout | None, window: str) -> WindowText:
    """A window's decoded text (engine thread), or why it has none: the reason the probes report for it."""
    if layout is None:
        return WindowText(None, "skipped", "no_scored_tokens")
    span = window_span(layout, window, False)
    if isinstance(span, NotScored):
        return WindowText(None, span.outcome, span.reason)
    end = len(ids) if span.end >= layout.positions else span.end  # the last token has no residual, yet is text
    return WindowText(engine.decode(list(ids[span.start : end])))


def headers(runtime: Runtime, ctx: RequestContext) -> dict[str, str] | None:
    """``X-miLLM-Probe-Verdicts`` on a finished non-streaming response that was monitored."""
    request = ctx.state.get(STATE)
    if request is None or request.results is None:  # a stream's headers go out before anything ran
        return None
    if request.header is None:  # rendered in finish, within the request's measured probe work
        request.header = header.render(request.results, runtime.settings["PROBE_VERDICT_HEADER_MAX_BYTES"])
    return {header.HEADER: request.header}


def extras(ctx: RequestContext) -> list[ResponseExtra] | None:
    """``millm_probe_verdicts`` beside ``choices`` (on a stream's finish chunk): the steered reply's.
    With ``with_unsteered`` each choice carries its own reply's too (on a stream, on its finish chunk)."""
    request = ctx.state.get(STATE)
    if request is None or request.results is None:
        return None
    found = [ResponseExtra({BODY_FIELD: request.results}, ORDER_PROBE_VERDICTS)]
    for out in ctx.outputs if request.variants else ():
        results = request.variants.get(out.variant or STEERED)
        if results is not None:
            found.append(ResponseExtra({BODY_FIELD: results}, ORDER_PROBE_VERDICTS, choice=out.index))
    return found
