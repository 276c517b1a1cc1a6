"""``ServingScoring``: next-token log-probabilities on ``/v1/completions`` and ``/v1/chat/completions``.

No HTTP here and no tensor math: the request is validated and refused here
(before any model load), prompts are tokenized the way generation tokenizes them,
and the engine's ``score_next_token`` does the math on the engine thread. Scoring
is never steered and never monitored: ``before_forward`` and ``after_generate``
are not called, and ``ctx.scoring`` tells the header and extras hooks so.

A body is in scoring mode when ``is_scoring_request`` says so; the generation
serving of its endpoint hands it here, and refuses the scoring-only fields on a
body that is not (``refuse_scoring_only_fields``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .. import hookcalls
from ..bodies.validate import validate
from ..context import RequestContext, SequenceOutput
from ..engine import SCORING, LayerHook
from ..errors import ContextLengthExceeded, FieldNotHonoured, InvalidParameter, UnusedFieldsRefused
from ..fields import is_no_change, strict_mode
from ..headers import Token, serialize_item
from ..host_view import host_of
from ..serving.base import ClientGone, Result, Serving, ServingHost
from ..serving.generation import flatten
from ..serving.prompts import chat_prompts, completion_prompts, refuse_out_of_vocabulary
from ..serving.render import response_id, usage as count_usage
from .engine import InvalidScoringRequest, NonFiniteLogits, ScoringParams, ScoringPrecisionUnavailable, TokenLogprob
from .protocol import (
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

#: Sampling fields that change nothing when nothing is sampled: reported as unused.
NOT_APPLIED_FIELDS = ("top_p", "stop", "frequency_penalty", "presence_penalty")
#: Below this (and above 0) dividing the logits by the temperature could overflow them.
MIN_TEMPERATURE = 0.001
#: Fields that mean something only in scoring mode: refused on a request that is not scoring.
SCORING_ONLY_FIELDS = ("return_tokens_as_token_ids", "scoring_precision")


def is_scoring_request(endpoint: str, body: dict[str, Any]) -> bool:
    """Scoring mode: next-token log-probabilities instead of generation.

    ``allowed_token_ids``; or ``logprobs`` (other than false) or, on chat,
    ``top_logprobs`` on a request for one token (``max_tokens: 1``) that is not
    streamed. A malformed value (``logprobs: 5`` on chat) is a scoring request
    too, so scoring validation refuses it rather than generation ignoring it.
    Logprobs on a longer or streamed request are generation logprobs, and so are they
    with ``echo`` or ``prompt_logprobs`` (the prompt's logprobs, then the completion's,
    as lm-evaluation-harness asks with ``echo: true, logprobs: 1, max_tokens: 1``).
    """
    if body.get("allowed_token_ids") is not None:
        return True
    if endpoint == "completions" and (body.get("echo") not in (None, False) or body.get("prompt_logprobs") is not None):
        return False
    logprobs = body.get("logprobs")
    asks = (logprobs is not None and logprobs is not False) or (
        endpoint == "chat.completions" and body.get("top_logprobs") is not None
    )
    if not asks or body.get("stream") is True:
        return False
    requested = body.get("max_tokens")
    if requested is None:
        requested = body.get("max_completion_tokens")
    return requested == 1 and requested is not True


def refuse_scoring_only_fields(ctx: RequestContext) -> None:
    """On a request that is not scoring: refuse a scoring-only field rather than ignore it."""
    for name in SCORING_ONLY_FIELDS:
        if name in ctx.body and not is_no_change(name, ctx.body[name]):
            raise FieldNotHonoured(
                f"{name} applies only to scoring requests (logprobs or allowed_token_ids, with max_tokens: 1)",
                param=name,
            )


@dataclass
class ScoringRequest:
    """A validated scoring request: what to ask the engine and how to render its answer."""

    params: ScoringParams
    logprobs: bool  # report log-probabilities (else ``logprobs: null``)
    token_ids_as_keys: bool
    precision_sent: str | None
    holds_float32: bool = False


def parse_scoring_request(ctx: RequestContext) -> ScoringRequest:
    """Validate a scoring request and refuse what scoring can't honour; no model is touched.

    ``ctx`` is the context generation built (its protocol and fields already checked).
    """
    body = ctx.body
    if SCORING not in ctx.engine_capabilities:
        sent = "allowed_token_ids" if body.get("allowed_token_ids") is not None else "logprobs"
        raise FieldNotHonoured(
            f"the {ctx.engine_name} engine cannot score (next-token log-probabilities with max_tokens: 1); "
            "ask for more than one token to get generation logprobs",
            param=sent,
        )
    assert ctx.host is not None
    unscorable = host_of(ctx.host).fields.unscorable
    for name in (key for key in body if key in unscorable):  # in body order
        if not is_no_change(name, body[name]):
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
    if (
        precision_sent == "float32"
        and not is_no_change("return_sae_activations", body.get("return_sae_activations"))
        and body.get("return_sae_activations") is not False
    ):
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


def _refuse_unscorable(window: int | None, where: str, tokens: int, *, at_least: bool = False) -> None:
    """``context_length_exceeded`` for a prompt of ``tokens`` tokens (``at_least``: a lower bound) that
    leaves no room in the window for the token scored."""
    if window is not None and tokens and tokens + 1 > window:
        least = "at least " if at_least else ""
        raise ContextLengthExceeded(
            f"this model's maximum context length is {window} tokens; {where} has {least}{tokens} "
            "tokens and scoring its next token needs 1 more",
            param=where,
        )


def prompt_location(ctx: RequestContext, index: int) -> str:
    """Where prompt ``index`` came from, as a client names it."""
    if ctx.is_chat:
        return "messages" if index == 0 else f"extra_messages[{index - 1}]"
    return "prompt" if len(ctx.prompts) <= 1 else f"prompt[{index}]"


class ServingScoring(Serving):
    """Scoring requests on one generation endpoint (``generation``, which builds their context).

    Per request, ``ctx.plan`` is the ``ScoringRequest``. One float32 request is
    admitted at a time (only ``/v1/completions`` offers ``scoring_precision``): its
    copy of the model takes 4 bytes per parameter and building it holds the engine
    thread, so a second one is refused with ``409 busy`` (retry when the first
    finishes) rather than queued. The place is taken on the text or engine thread,
    in queue order, only when a copy is needed (a model loaded in float32 is scored
    as it is).
    """

    def __init__(self, host: ServingHost, generation: Serving) -> None:
        super().__init__(host)
        self.generation = generation
        self.endpoint = generation.endpoint
        chat = self.endpoint == "chat.completions"
        self.protocol = ScoringChatRequest if chat else ScoringCompletionRequest
        self.response_model = ScoringChatResponse if chat else ScoringCompletionResponse
        self._float32 = threading.Lock()

    def build_context(self, body: dict[str, Any], headers: dict[str, str]) -> RequestContext:
        """The context generation builds (same protocol, fields and conversations), then scoring's own checks."""
        ctx = self.generation.build_context(body, headers)
        ctx.scoring = True
        ctx.plan = parse_scoring_request(ctx)
        return ctx

    async def serve(self, ctx: RequestContext, gone: ClientGone | None = None) -> Result:
        try:
            return await super().serve(ctx, gone)
        finally:
            request: ScoringRequest = ctx.plan
            if request.holds_float32:
                request.holds_float32 = False
                self._float32.release()

    # --- text or engine thread ---------------------------------------------------------
    def refuse_unfitting_text(self, ctx: RequestContext) -> None:
        """A text prompt that cannot fit the window with the token scored, refused from its length alone
        (``Engine.min_tokens``) before it is tokenized; a chat's is refused in ``tokenize``, once rendered."""
        engine = ctx.engine
        assert engine is not None
        if ctx.is_chat:
            return
        prompts = ctx.params.prompts
        for index, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                where = "prompt" if len(prompts) <= 1 else f"prompt[{index}]"
                _refuse_unscorable(engine.info.context_window, where, engine.min_tokens([prompt]), at_least=True)

    def tokenize(self, ctx: RequestContext) -> None:
        """Prompts tokenized as generation tokenizes them (no generic chat render), then checked for scoring."""
        engine = ctx.engine
        assert engine is not None
        request: ScoringRequest = ctx.plan
        vocab = engine.info.vocab_size
        window = engine.info.context_window
        if ctx.is_chat:
            ctx.prompts = chat_prompts(
                ctx,
                fallback=False,
                refuse_unfitting=lambda index, least: _refuse_unscorable(
                    window, prompt_location(ctx, index), least, at_least=True
                ),
            )
        else:
            ctx.prompts = completion_prompts(ctx)
            refuse_out_of_vocabulary(ctx, InvalidScoringRequest)
        for index, ids in enumerate(ctx.prompts):
            where = prompt_location(ctx, index)
            if not ids:
                raise InvalidScoringRequest(
                    f"{where} tokenises to nothing; there is no next token to score", param=where
                )
            _refuse_unscorable(window, where, len(ids))
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

    # --- engine thread -------------------------------------------------------------------
    def run(self, ctx: RequestContext) -> list[dict[str, Any]]:
        """Score every prompt and render each answer's tokens (tokenizers live on this thread)."""
        engine = ctx.engine
        assert engine is not None
        request: ScoringRequest = ctx.plan
        hooks = []
        if request.params.precision != "float32":
            hooks = [
                read_only(h)
                for h in flatten(hookcalls.request(self.host.pm, "before_scoring", ctx=ctx))
                if isinstance(h, LayerHook)
            ]
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
            ctx.outputs.append(
                SequenceOutput(
                    index=index,
                    prompt_index=index,
                    prompt_ids=ids,
                    token_ids=[result.chosen.token_id],
                    text=text,
                    finish_reason="length",
                )
            )
            rendered.append(
                {
                    "text": text,
                    "chosen": _token(engine, result.chosen),
                    "top": [_token(engine, t) for t in result.top],
                    "prompt_chars": _prompt_chars(ctx, engine, index),
                }
            )
        return rendered

    # --- event loop ----------------------------------------------------------------------
    def render(self, ctx: RequestContext, output: list[dict[str, Any]]) -> dict[str, Any]:
        return render_body(ctx, ctx.plan, output)

    def headers(self, ctx: RequestContext) -> dict[str, str]:
        headers = super().headers(ctx)
        request: ScoringRequest = ctx.plan
        if request.precision_sent is not None:
            headers["X-miLLM-Scoring-Precision"] = serialize_item(Token(request.precision_sent))
        return headers


def read_only(hook: LayerHook) -> LayerHook:
    """The same hook with its return value dropped: nothing a scoring hook does can steer."""

    def read(hidden: Any, start: int) -> None:
        hook.callback(hidden, start)

    batched = hook.batched
    if batched is None:
        return replace(hook, callback=read)

    def read_rows(hidden: Any, rows: Any) -> None:
        batched(hidden, rows)

    return replace(hook, callback=read, batched=read_rows)


def _token(engine: Any, token: TokenLogprob) -> dict[str, Any]:
    raw = engine.token_bytes(token.token_id)
    return {
        "id": token.token_id,
        "text": raw.decode("utf-8", "replace"),
        "logprob": token.logprob,
        "bytes": list(raw.decode("utf-8", "replace").encode("utf-8")),
    }


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

    # What both response models carry, set once (each scored output holds its one token).
    envelope: dict[str, Any] = dict(
        id=response_id(ctx),
        created=ctx.created,
        model=ctx.served_model,
        system_fingerprint=ctx.engine.info.system_fingerprint,
        usage=Usage(**count_usage(ctx)),
    )
    response: ScoringChatResponse | ScoringCompletionResponse
    if ctx.is_chat:
        choices = [_chat_choice(index, score, request, key) for index, score in enumerate(scores)]
        response = ScoringChatResponse(object="chat.completion", choices=choices, **envelope)
    else:
        if request.precision_sent is not None:
            envelope["scoring_precision"] = request.precision_sent
        completions = [_completion_choice(index, score, request, key) for index, score in enumerate(scores)]
        response = ScoringCompletionResponse(object="text_completion", choices=completions, **envelope)
    return response.model_dump(mode="json", exclude_unset=True)


def _chat_choice(
    index: int, score: dict[str, Any], request: ScoringRequest, key: Callable[[dict[str, Any]], str]
) -> ScoringChatChoice:
    logprobs = None
    if request.logprobs:
        top = [ChatTopLogprob(token=key(t), logprob=t["logprob"], bytes=t["bytes"]) for t in score["top"]]
        chosen = score["chosen"]
        logprobs = ChatLogprobs(
            content=[
                ChatTokenLogprob(token=key(chosen), logprob=chosen["logprob"], bytes=chosen["bytes"], top_logprobs=top)
            ],
            refusal=None,
        )
    return ScoringChatChoice(
        index=index,
        message=ScoringChatMessage(role="assistant", content=score["text"], refusal=None),
        logprobs=logprobs,
        finish_reason="length",
    )


def _completion_choice(
    index: int, score: dict[str, Any], request: ScoringRequest, key: Callable[[dict[str, Any]], str]
) -> ScoringCompletionChoice:
    logprobs = None
    if request.logprobs:
        top: dict[str, float] = {}
        for t in score["top"]:
            top.setdefault(key(t), t["logprob"])  # ids that decode alike share the best entry
        chosen = score["chosen"]
        logprobs = CompletionLogprobs(
            tokens=[key(chosen)],
            token_logprobs=[chosen["logprob"]],
            top_logprobs=[top],
            text_offset=[score["prompt_chars"]],
        )
    return ScoringCompletionChoice(text=score["text"], index=index, logprobs=logprobs, finish_reason="length")


__all__ = [
    "ScoringRequest",
    "ServingScoring",
    "is_scoring_request",
    "parse_scoring_request",
    "refuse_scoring_only_fields",
    "render_body",
]
