"""Scoring mode: next-token log-probabilities on ``/v1/completions`` and ``/v1/chat/completions``.

No HTTP here and no tensor math: the request is validated and refused here
(before any model load), prompts are tokenized the way generation tokenizes them,
and the engine's ``score_next_token`` does the math on the engine thread. Scoring
is never steered and never monitored: ``before_forward`` and ``after_generate``
are not called, and ``ctx.scoring`` tells the header and extras hooks so.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .. import hookcalls
from ..context import RequestContext, SequenceOutput
from ..engine import LayerHook
from ..engine_scoring import (
    InvalidScoringRequest,
    NonFiniteLogits,
    ScoringParams,
    ScoringPrecisionUnavailable,
    TokenLogprob,
)
from ..errors import ContextLengthExceeded, FieldNotHonoured, InvalidParameter, UnusedFieldsRefused
from ..fields import is_no_change, strict_mode
from ..headers import Token, serialize_item
from ..protocol import validate
from ..protocol_scoring import (
    ChatLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogprobs,
    ScoringChatChoice,
    ScoringChatMessage,
    ScoringChatRequest,
    ScoringChatResponse,
    ScoringCompletionChoice,
    ScoringCompletionRequest,
    ScoringCompletionResponse,
    Usage,
)
from .generation import flatten
from .responses import response_id, usage as count_usage
from .run import add_extras, collect_headers

if TYPE_CHECKING:
    from ..app import Host

#: Fields that steer, constrain or monitor generation: a scoring request carrying one is refused.
UNSCORABLE_FIELDS = (
    "profile", "steering_intensity", "steering", "response_format",
    "tools", "tool_choice", "parallel_tool_calls", "functions", "function_call",
)
#: Sampling fields that change nothing when nothing is sampled: reported as unused.
NOT_APPLIED_FIELDS = ("top_p", "stop", "frequency_penalty", "presence_penalty")
#: Below this (and above 0) dividing the logits by the temperature could overflow them.
MIN_TEMPERATURE = 0.001


@dataclass
class ScoringRequest:
    """A validated scoring request: what to ask the engine and how to render its answer."""

    params: ScoringParams
    logprobs: bool  # report log-probabilities (else ``logprobs: null``)
    token_ids_as_keys: bool
    precision_sent: str | None
    holds_float32: bool = False


def parse_scoring_request(ctx: RequestContext) -> ScoringRequest:
    """Validate a scoring request and refuse what scoring can't honour; no model is touched."""
    body = ctx.body
    for name in UNSCORABLE_FIELDS:
        if name in body and not is_no_change(name, body[name]):
            raise FieldNotHonoured(
                f"{name} cannot be used on a scoring request (logprobs or allowed_token_ids): "
                "scoring is never steered, constrained or monitored",
                param=name,
            )
    params = validate(ScoringChatRequest if ctx.is_chat else ScoringCompletionRequest, body)
    if params.stream:
        raise InvalidParameter("scoring requests (logprobs or allowed_token_ids) cannot be streamed", param="stream")
    if params.requested_max_tokens != 1:
        param = "max_completion_tokens" if params.max_tokens is None and params.max_completion_tokens else "max_tokens"
        raise InvalidParameter(
            "scoring mode (logprobs or allowed_token_ids) scores one next token: send max_tokens: 1 "
            f"(got {params.requested_max_tokens if params.requested_max_tokens is not None else 'none'})",
            param=param,
        )
    if (params.n or 1) != 1:
        raise InvalidParameter(f"scoring mode needs n: 1 (got {params.n})", param="n")
    temperature = params.temperature or 0.0
    if 0 < temperature < MIN_TEMPERATURE:
        raise InvalidParameter(
            f"temperature {temperature} would overflow the logits; send 0 (no scaling) or at least {MIN_TEMPERATURE}",
            param="temperature",
        )
    allowed = _allowed_ids(params.allowed_token_ids)
    if ctx.is_chat:
        if params.top_logprobs is not None and params.logprobs is not True:
            raise InvalidParameter("top_logprobs needs logprobs: true", param="top_logprobs")
        logprobs = params.logprobs is True
        top = params.top_logprobs or 0 if logprobs else 0
        precision_sent = None
    else:
        logprobs = params.logprobs is not None
        # Every listed token is returned: the set is what the answer is normalised over.
        top = (len(allowed) if allowed else params.logprobs) if logprobs else 0
        precision_sent = params.scoring_precision
    if precision_sent == "float32" and not is_no_change("return_sae_activations", body.get("return_sae_activations")) \
            and body.get("return_sae_activations") is not False:
        raise InvalidParameter(
            "scoring_precision float32 runs on a copy of the model that reads no activations; "
            "drop return_sae_activations or score natively",
            param="scoring_precision",
        )
    _report_not_applied(ctx)
    return ScoringRequest(
        params=ScoringParams(
            temperature=temperature, top=top, allowed_token_ids=allowed, precision=precision_sent or "native"
        ),
        logprobs=logprobs,
        token_ids_as_keys=bool(params.return_tokens_as_token_ids),
        precision_sent=precision_sent,
    )


def _allowed_ids(ids: list[int] | None) -> tuple[int, ...] | None:
    if ids is None:
        return None
    negative = [t for t in ids if t < 0]
    if negative:
        raise InvalidScoringRequest(
            f"allowed_token_ids: token id {negative[0]} is outside the vocabulary", param="allowed_token_ids"
        )
    return tuple(dict.fromkeys(ids))  # a set, in the order sent


def _report_not_applied(ctx: RequestContext) -> None:
    sent = [name for name in NOT_APPLIED_FIELDS if ctx.body.get(name) is not None]
    if sent and strict_mode(ctx.headers):
        raise UnusedFieldsRefused(
            "X-miLLM-Strict refuses fields scoring mode does not use: " + ", ".join(sent), param=sent[0]
        )
    ctx.unused_fields.extend(sent)


def prompt_location(ctx: RequestContext, index: int) -> str:
    """Where prompt ``index`` came from, as a client names it."""
    if ctx.is_chat:
        return "messages" if index == 0 else f"extra_messages[{index - 1}]"
    return "prompt" if len(ctx.prompts) <= 1 else f"prompt[{index}]"


class Scoring:
    """``host.scoring``: serves a scoring request, ``await scoring(host, ctx) -> (body, headers)``.

    One float32 request is admitted at a time: its copy of the model takes 4 bytes
    per parameter and building it holds the engine thread, so a second one is
    refused with ``409 busy`` (retry when the first finishes) rather than queued.
    The place is taken on the engine thread, in queue order, only when a copy is
    needed (a model loaded in float32 is scored as it is).
    """

    def __init__(self) -> None:
        self._float32 = threading.Lock()

    async def __call__(self, host: Host, ctx: RequestContext) -> tuple[dict[str, Any], dict[str, str]]:
        request = await asyncio.to_thread(parse_scoring_request, ctx)  # validation: off the event loop
        try:
            admission = await host.pipeline.prepare(ctx, tokenize=lambda c: self._tokenize(host, c, request))
            try:
                scores = await host.scheduler.run(self._score, host, ctx, request, cancel=ctx.cancel_event)
            finally:
                admission.release()
        finally:
            if request.holds_float32:
                request.holds_float32 = False
                self._float32.release()
        ctx.finished = True
        body = render_body(ctx, request, scores)
        add_extras(host, ctx, body)
        headers = collect_headers(host, ctx)
        if request.precision_sent is not None:
            headers["X-miLLM-Scoring-Precision"] = serialize_item(Token(request.precision_sent))
        return body, headers

    # --- engine thread ---------------------------------------------------------------
    def _tokenize(self, host: Host, ctx: RequestContext, request: ScoringRequest) -> None:
        engine = ctx.engine
        assert engine is not None
        vocab = engine.info.vocab_size
        host.pipeline.tokenize(ctx)  # the one way prompts and chats become ids
        window = engine.info.context_window
        for index, ids in enumerate(ctx.prompts):
            where = prompt_location(ctx, index)
            if not ids:
                raise InvalidScoringRequest(f"{where} tokenises to nothing; there is no next token to score", param=where)
            if window is not None and len(ids) + 1 > window:
                raise ContextLengthExceeded(
                    f"this model's maximum context length is {window} tokens; {where} has {len(ids)} "
                    "tokens and scoring its next token needs 1 more",
                    param=where,
                )
        bad = [t for t in request.params.allowed_token_ids or () if t >= vocab]
        if bad:
            raise InvalidScoringRequest(
                f"allowed_token_ids: token id {bad[0]} is outside the vocabulary (size {vocab})",
                param="allowed_token_ids",
            )
        if request.params.precision == "float32" and engine.info.dtype != "float32":
            if not self._float32.acquire(blocking=False):
                raise ScoringPrecisionUnavailable(
                    "busy", "another request's float32 copy of the model is in use; retry when it finishes"
                )
            request.holds_float32 = True

    def _score(self, host: Host, ctx: RequestContext, request: ScoringRequest) -> list[dict[str, Any]]:
        """Score every prompt and render each answer's tokens (tokenizers live on this thread)."""
        engine = ctx.engine
        assert engine is not None
        hooks = []
        if request.params.precision != "float32":
            hooks = [read_only(h) for h in flatten(hookcalls.request(host.pm, "before_scoring", ctx=ctx)) if isinstance(h, LayerHook)]
        try:
            results = engine.score_next_token(ctx.prompts, request.params, hooks=hooks)
        except NonFiniteLogits as exc:
            where = prompt_location(ctx, exc.index)
            failed = NonFiniteLogits(f"{where}: {exc.message}", index=exc.index)
            failed.param = where
            raise failed from None
        rendered = []
        for index, (ids, result) in enumerate(zip(ctx.prompts, results, strict=True)):
            text = engine.decode([result.chosen.token_id])
            ctx.outputs.append(SequenceOutput(index=index, prompt_index=index, prompt_ids=ids,
                                              token_ids=[result.chosen.token_id], text=text,
                                              finish_reason="length"))
            rendered.append({
                "text": text,
                "chosen": _token(engine, result.chosen),
                "top": [_token(engine, t) for t in result.top],
                "prompt_chars": _prompt_chars(ctx, engine, index),
            })
        return rendered


def read_only(hook: LayerHook) -> LayerHook:
    """The same hook with its return value dropped: nothing a scoring hook does can steer."""

    def read(hidden: Any, start: int) -> None:
        hook.callback(hidden, start)

    return replace(hook, callback=read)


def _token(engine: Any, token: TokenLogprob) -> dict[str, Any]:
    raw = engine.token_bytes(token.token_id)
    return {"id": token.token_id, "text": raw.decode("utf-8", "replace"), "logprob": token.logprob,
            "bytes": list(raw.decode("utf-8", "replace").encode("utf-8"))}


def _prompt_chars(ctx: RequestContext, engine: Any, index: int) -> int:
    """Characters before the scored token (OpenAI's ``text_offset`` of the completion)."""
    if ctx.is_chat:
        return 0
    prompt = ctx.params.prompts[index]
    return len(prompt) if isinstance(prompt, str) else len(engine.decode(prompt))


def render_body(ctx: RequestContext, request: ScoringRequest, scores: list[dict[str, Any]]) -> dict[str, Any]:
    """The OpenAI-shaped response, built from the published response models."""
    assert ctx.engine is not None

    def key(token: dict[str, Any]) -> str:
        return f"token_id:{token['id']}" if request.token_ids_as_keys else token["text"]

    usage = Usage(**count_usage(ctx))  # each scored output holds its one token
    common: dict[str, Any] = dict(id=response_id(ctx), created=ctx.created, model=ctx.model.id,
                                  system_fingerprint=ctx.engine.info.system_fingerprint, usage=usage)
    response: ScoringChatResponse | ScoringCompletionResponse
    if ctx.is_chat:
        chat_choices = []
        for index, score in enumerate(scores):
            chat_logprobs = None
            if request.logprobs:
                top = [ChatTopLogprob(token=key(t), logprob=t["logprob"], bytes=t["bytes"]) for t in score["top"]]
                chosen = score["chosen"]
                chat_logprobs = ChatLogprobs(content=[ChatTokenLogprob(
                    token=key(chosen), logprob=chosen["logprob"], bytes=chosen["bytes"], top_logprobs=top)],
                    refusal=None)
            chat_choices.append(ScoringChatChoice(
                index=index, message=ScoringChatMessage(role="assistant", content=score["text"], refusal=None),
                logprobs=chat_logprobs, finish_reason="length"))
        response = ScoringChatResponse(object="chat.completion", choices=chat_choices, **common)
    else:
        completion_choices = []
        for index, score in enumerate(scores):
            completion_logprobs = None
            if request.logprobs:
                best: dict[str, float] = {}
                for t in score["top"]:
                    best.setdefault(key(t), t["logprob"])  # ids that decode alike share the best entry
                chosen = score["chosen"]
                completion_logprobs = CompletionLogprobs(tokens=[key(chosen)], token_logprobs=[chosen["logprob"]],
                                                         top_logprobs=[best], text_offset=[score["prompt_chars"]])
            completion_choices.append(ScoringCompletionChoice(text=score["text"], index=index,
                                                              logprobs=completion_logprobs, finish_reason="length"))
        fields: dict[str, Any] = {}
        if request.precision_sent is not None:
            fields["scoring_precision"] = request.precision_sent
        response = ScoringCompletionResponse(object="text_completion", choices=completion_choices, **common, **fields)
    return response.model_dump(mode="json", exclude_unset=True)


__all__ = ["Scoring", "ScoringRequest", "parse_scoring_request", "render_body"]
