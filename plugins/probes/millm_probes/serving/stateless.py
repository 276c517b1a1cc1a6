"""``POST /api/probes/score``: asking imported probes about inputs you already have.

Nothing is persisted and nothing armed is touched. Other plugins' results for the
scored behaviours (rule signals, hook ``monitor_results`` with ``ctx=None``) sit
with their behaviour's probe results, as on live traffic. Each input takes its own
place in the queue and its own unsteered forward pass on the resident model,
scored by the code live serving uses. An input's windows are never guessed: a
boundary that the input does not establish is reported, not assumed.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from millm_host.api import (
    ChatMessage,
    ContextLengthExceeded,
    InvalidParameter,
    MillmError,
    ModelBusy,
    ModelNotLoaded,
    MonitoredRequest,
    NoChatTemplate,
    WindowText,
    message_text,
    model_markers,
    stateless_monitor_results,
    validate,
)

from .. import store
from ..arming.behaviours import select
from ..arming.gates import identity_check, model_identity
from ..arming.parity import parity_summary
from ..arming.sets import blocks_for
from ..definition import Window
from ..errors import GateRefused, ModelChanged, mismatch_message
from ..results import ProbeView, Reading, Served, behaviour_sets, merged, result_object
from ..runtime import Runtime
from ..scoring.evaluate import Plan, compile_bank, forward_columns, read_pairs
from ..scoring.windows import common_prefix, measure
from .live import monitored_behaviours, window_text
from .trace import new_trace


class ScoreInput(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None
    prompt_tokens: int | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    text: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ScoreInput:
        kinds = [k for k in ("token_ids", "messages", "text") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("an input carries exactly one of token_ids, messages or text")
        if self.prompt_tokens is not None and self.text is not None:
            raise ValueError("prompt_tokens goes with token_ids or messages, not text")
        return self


class ScoreRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    probe_ids: Annotated[list[str], Field(min_length=1)] | None = None
    behaviours: Annotated[list[str], Field(min_length=1)] | None = None  # each behaviour's set, armed or not
    inputs: Annotated[list[ScoreInput], Field(min_length=1)]
    windows: Annotated[list[Window], Field(min_length=1)] | None = None
    token_scores: bool = False  # each result carries its window's per-token scores (as probe_token_scores)

    @model_validator(mode="after")
    def _unique(self) -> ScoreRequest:
        for name in ("probe_ids", "behaviours", "windows"):
            values = getattr(self, name)
            if values is not None and len(set(values)) != len(values):
                raise ValueError(f"{name} lists a value twice")
        return self


class Prepared:
    """One input as ids, with the boundaries it states or implies."""

    def __init__(
        self, ids: list[int], prompt_len: int | None, failure: str | None, conversation: list[dict[str, Any]] | None
    ) -> None:
        self.ids, self.prompt_len, self.failure, self.conversation = ids, prompt_len, failure, conversation


def _conversation(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    return [{"role": m.role, "content": message_text(m, i)} for i, m in enumerate(messages)]


def _refuse_unfitting(window: int | None, least: int, where: str) -> None:
    """An input whose rendered text has at least ``least`` tokens (``Engine.min_tokens``, from its length
    alone: tokenizing 4 MiB took seconds), refused where that cannot fit the window."""
    if window is not None and least > window:
        raise ContextLengthExceeded(
            f"this model's maximum context length is {window} tokens; the input has at least {least}", param=where
        )


def _prepare(engine: Any, inputs: list[ScoreInput]) -> list[Prepared]:
    """Tokenize and check every input before any forward pass (engine thread)."""
    info = engine.info
    prepared = []
    for i, item in enumerate(inputs):
        where = f"inputs[{i}]"
        stated = item.prompt_tokens
        conversation = None
        if item.token_ids is not None:
            ids = list(item.token_ids)
            derived = None
        else:
            conversation = _conversation(item.messages) if item.messages else [{"role": "user", "content": item.text}]
            try:
                text = engine.chat_text(conversation, fallback=False)
                _refuse_unfitting(info.context_window, engine.min_tokens([text]), where)  # before tokenizing it
                ids = engine.tokenize_chat_text(text)
                ends_with_reply = conversation[-1]["role"] == "assistant"
                derived = (
                    common_prefix(engine.chat_ids(conversation[:-1], fallback=False), ids)
                    if ends_with_reply
                    else len(ids)
                )
            except NoChatTemplate as exc:
                raise NoChatTemplate(exc.message, param=f"{where}.{'messages' if item.messages else 'text'}") from None
            except InvalidParameter as exc:  # the engine names "messages"; here they are this input's
                raise InvalidParameter(exc.message, param=f"{where}.messages") from None
        bad = [t for t in ids if t >= info.vocab_size]
        if bad:
            raise InvalidParameter(
                f"token id {bad[0]} is outside the vocabulary (size {info.vocab_size})", param=f"{where}.token_ids"
            )
        if not ids:
            raise InvalidParameter("the input is empty", param=where)
        if info.context_window is not None and len(ids) > info.context_window:
            raise ContextLengthExceeded(
                f"this model's maximum context length is {info.context_window} tokens; the input has {len(ids)}",
                param=where,
            )
        prompt_len, failure = derived, None
        if stated is not None:
            if not 0 <= stated <= len(ids):
                prompt_len, failure = None, "prompt_boundary_invalid"
            elif derived is not None and stated != derived:
                prompt_len, failure = None, "prompt_boundary_conflict"
            else:
                prompt_len = stated
        prepared.append(Prepared(ids, prompt_len, failure, conversation))
    return prepared


def _score_one(
    runtime: Runtime, engine: Any, views: list[ProbeView], plan: Plan, item: Prepared, compiled: dict[str, Any]
) -> tuple[list[Any], dict[str, WindowText]]:
    """Readings of one input, in listing order, and the text of each window a behaviour's probes report
    (for the results other plugins add beside the probes', hook ``monitor_results``) (engine thread)."""
    pairs = plan.pairs
    windows = {w for ws in monitored_behaviours(pairs).values() for w in ws}
    if not engine.hook_points:  # llama.cpp exposes no layers to read
        unscored = {w: WindowText(None, "skipped", "engine_unsupported") for w in windows}
        return [(pair, Reading("skipped", "engine_unsupported")) for pair in pairs], unscored
    if "bank" not in compiled:  # compiled once, on the first input's turn on the engine thread
        compiled["bank"], compiled["unusable"] = compile_bank(
            views, engine, runtime.settings["PROBE_SAE_DIR"], runtime.encoders
        )
    bank = compiled["bank"]
    columns = forward_columns(engine, bank, item.ids) if bank is not None else None
    layout = measure(
        engine,
        item.ids,
        len(item.ids),
        prompt_len=item.prompt_len,
        boundary_failure=item.failure,
        prefix_ids=runtime.prefix_ids(engine) if plan.skip_prefix else None,
        conversation=item.conversation,
        no_turns="token_ids_have_no_turns",
        need_last_user=plan.last_user,
        markers=model_markers(runtime.settings["MILLM_REASONING"], engine.info.chat_template),
        need_reasoning=plan.reasoning,
    )
    readings = list(zip(pairs, read_pairs(pairs, bank, columns, layout, compiled["unusable"]), strict=True))
    return readings, {w: window_text(engine, item.ids, layout, w) for w in windows}


def check(runtime: Runtime, body: dict[str, Any]) -> ScoreRequest:
    """``body`` as a request, refused for its shape and its limits before any probe or model is looked at
    (worker thread: in proportion to the body). A Batch line is checked with it as it validates."""
    settings = runtime.settings
    request = validate(ScoreRequest, body)
    if len(request.inputs) > settings["PROBE_SCORE_MAX_INPUTS"]:
        raise InvalidParameter(
            f"at most {settings['PROBE_SCORE_MAX_INPUTS']} inputs per request (PROBE_SCORE_MAX_INPUTS)",
            param="inputs",
            code="PROBE_SCORE_MAX_INPUTS",
        )
    maximum = settings["PROBE_MAX_ARMED"]
    if request.probe_ids is not None and len(request.probe_ids) > maximum:  # before looking any up
        raise InvalidParameter(
            f"at most {maximum} probes per request (PROBE_MAX_ARMED)", param="probe_ids", code="PROBE_MAX_ARMED"
        )
    return request


async def score(runtime: Runtime, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """Score every input with every chosen probe; nothing is stored."""
    host = runtime.host
    settings = runtime.settings
    request = await asyncio.to_thread(check, runtime, body)  # in proportion to the body: off the loop
    engine, resident_id = host.current_model()
    identity = model_identity(host, resident_id)
    all_views = await asyncio.to_thread(_load_views, runtime, request.probe_ids, request.behaviours)
    if len(all_views) > settings["PROBE_MAX_ARMED"]:  # named or not: all imported probes count when none are
        raise InvalidParameter(
            f"at most {settings['PROBE_MAX_ARMED']} probes per request (PROBE_MAX_ARMED); this request would "
            f"score {len(all_views)}: name fewer with probe_ids or behaviours",
            param="behaviours" if request.behaviours and not request.probe_ids else "probe_ids",
            code="PROBE_MAX_ARMED",
        )
    views, skipped = [], []
    refused: list[dict[str, Any]] = []
    for view in all_views:
        mismatches, _ = identity_check(view.definition.model, identity)
        if not mismatches:
            views.append(view)
        elif request.probe_ids or request.behaviours:
            refused.append({"probe_id": view.probe_id, "mismatches": mismatches})
        else:
            skipped.append(
                {"probe_id": view.probe_id, "name": view.name, "reason": "model_mismatch", "mismatches": mismatches}
            )
    if refused:
        raise GateRefused(
            "identity",
            "PROBE_MODEL_MISMATCH",
            "the loaded model is not the one these probes were "
            "fitted on: " + "; ".join(f"{r['probe_id']}: {mismatch_message(r['mismatches'])}" for r in refused),
            probes=refused,
        )
    windows = {v.probe_id: list(request.windows) if request.windows else v.windows for v in views}
    plan = Plan.of((view, window) for view in views for window in windows[view.probe_id])
    reports = await asyncio.to_thread(store.latest_parity_reports, host.db, [v.probe_id for v in views])
    trace = new_trace(headers)
    request_id = "score-" + uuid.uuid4().hex
    async with host.engine_slot(resident_id) as slot:
        if slot.engine is not engine:
            raise ModelBusy("the model changed while this request started; retry", param="model")
        prepared = await slot.run(_prepare, engine, request.inputs)
    served = Served.of(engine, "stateless")
    blocks = blocks_for(views, runtime.members)  # of each set, the members this request scores
    compiled: dict[str, Any] = {}
    behaviours = monitored_behaviours(plan.pairs)
    shared: dict[str, Any] = {}  # other plugins' per-request state, across this request's inputs
    outputs: list[dict[str, Any]] = []
    changed = False
    for index, item in enumerate(prepared):
        output: dict[str, Any] = {"index": index, "n_tokens": len(item.ids), "prompt_tokens": item.prompt_len}
        outputs.append(output)
        changed = changed or host.resident_engine() is not engine  # an unload or a reload replaces it
        if not changed and views:
            try:
                async with host.engine_slot(resident_id) as slot:
                    changed = slot.engine is not engine
                    if not changed:
                        readings, texts = await slot.run(_score_one, runtime, engine, views, plan, item, compiled)
            except (ModelBusy, ModelNotLoaded):  # an unload or a load is under way
                changed = True
        if changed:
            output["error"] = ModelChanged(
                "the model changed during this request; no input is scored on a different model from the first",
                param=f"inputs[{index}]",
            ).to_dict()
            continue
        output["results"] = [
            result_object(
                view,
                window,
                reading,
                served,
                trace,
                request_id,
                "not_persisted",
                blocks.get(view.probe_id),
                token_scores=request.token_scores,
            )
            for (view, window), reading in (readings if views else [])
        ]
        if behaviours:  # other plugins' results (rule signals) beside their behaviour's probes', as on live traffic
            monitored = MonitoredRequest(
                behaviours=behaviours,
                request_id=request_id,
                trace_id=trace.trace_id,
                span_id=trace.span_id,
                skip=None if engine.hook_points else "engine_unsupported",
                interrupted=None,
                read_window=texts.__getitem__,
                host=host,
                stateless=True,
                state=shared,
                sets=behaviour_sets(plan.pairs, blocks),
            )
            others = await asyncio.to_thread(stateless_monitor_results, host, monitored)
            output["results"] = merged(output["results"], others)
    return {
        "object": "probe.score",
        "request_id": request_id,
        "model": identity,
        "results": outputs,
        "skipped": skipped,
        "probes": [
            {
                "probe_id": v.probe_id,
                "name": v.name,
                "windows": windows[v.probe_id],
                "parity": parity_summary(reports.get(v.probe_id)),
            }
            for v in views
        ],
    }


def _load_views(runtime: Runtime, probe_ids: list[str] | None, behaviours: list[str] | None) -> list[ProbeView]:
    """The named probes and behaviours' sets, or every imported probe (blocking: database and parsing)."""
    db = runtime.host.db
    if not probe_ids and not behaviours:
        return runtime.views(store.list_probes(db))
    rows = store.find_probes(db, probe_ids) if probe_ids else []
    if behaviours:
        every = store.list_probes(db)
        for i, key in enumerate(behaviours):
            try:
                chosen = select(every, key, None, None)
            except MillmError as exc:
                exc.param = f"behaviours[{i}]"
                raise
            taken = {x.id for x in rows}
            rows += [r for r in chosen if r.id not in taken]
    return runtime.views(rows)
