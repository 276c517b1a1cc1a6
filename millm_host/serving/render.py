"""OpenAI-shaped bodies and chunks for chat and text completions."""

from __future__ import annotations

from typing import Any

from ..context import RequestContext, SequenceOutput
from ..default_fields import seed_scope
from . import prompt_logprobs
from .logprobs import render as render_logprobs

#: A choice's reply variant (``"steered"`` or ``"unsteered"``), on every choice of a ``with_unsteered`` request.
VARIANT = "millm_variant"


def response_id(ctx: RequestContext) -> str:
    prefix = "chatcmpl" if ctx.is_chat else "cmpl"
    return f"{prefix}-{ctx.request_id}"


def system_fingerprint(ctx: RequestContext) -> str:
    """The engine's fingerprint, marked ``+continuous`` when the generation shares a continuous batch:
    the rows beside it can round its logits apart, so the same seed and body promise the same text
    only for the same batch's shape (``X-miLLM-Seed``'s ``scope="batch-shape"``)."""
    assert ctx.engine is not None
    base = ctx.engine.info.system_fingerprint
    return base + "+continuous" if seed_scope(ctx) == "batch-shape" else base


def usage(ctx: RequestContext) -> dict[str, Any]:
    """``usage``; with ``prompt_tokens_details.cached_tokens`` when the engine says what its prompt cache held
    (each prompt counted once: the most any of its choices found)."""
    prompt = sum(len(p) for p in ctx.prompts)
    completion = sum(len(o.token_ids) for o in ctx.outputs)
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    cached: dict[int, int] = {}
    for out in ctx.outputs:
        if out.cached_tokens is not None:
            cached[out.prompt_index] = max(cached.get(out.prompt_index, 0), out.cached_tokens)
    if cached:
        body["prompt_tokens_details"] = {"cached_tokens": sum(cached.values())}
    if ctx.reasoning is not None:  # a model that thinks: the tokens its blocks took (OpenAI's field)
        body["completion_tokens_details"] = {"reasoning_tokens": sum(o.reasoning_tokens for o in ctx.outputs)}
    return body


def completion_body(ctx: RequestContext) -> dict[str, Any]:
    """The non-streaming response for a chat or text completion."""
    assert ctx.engine is not None
    choices: list[dict[str, Any]] = []
    for out in ctx.outputs:
        if ctx.is_chat:
            message: dict[str, Any] = {"role": "assistant", "content": out.text, "refusal": None}
            if ctx.reasoning is not None and ctx.include_reasoning:  # a model that thinks (vLLM's field)
                message["reasoning_content"] = out.reasoning
            message.update(out.message_extras)
            choices.append(
                {
                    "index": out.index,
                    "message": message,
                    "logprobs": render_logprobs(ctx, out.logprobs),
                    "finish_reason": out.finish_reason,
                }
            )
        else:
            choices.append(_completion_choice(ctx, out))
        if out.variant is not None:  # with_unsteered: which reply this choice is
            choices[-1][VARIANT] = out.variant
    return {
        "id": response_id(ctx),
        "object": "chat.completion" if ctx.is_chat else "text_completion",
        "created": ctx.created,
        "model": ctx.served_model,
        "system_fingerprint": system_fingerprint(ctx),
        "choices": choices,
        "usage": usage(ctx),
    }


def _completion_choice(ctx: RequestContext, out: SequenceOutput) -> dict[str, Any]:
    """A text completion's choice: after its echoed prompt (text and logprobs) when asked, with vLLM's
    ``prompt_logprobs`` when asked."""
    text, entries = out.text, out.logprobs
    echo = prompt_logprobs.echoed(ctx, out.prompt_index)
    if echo is not None:
        prompt_text, prompt_entries = echo
        text = prompt_text + text
        if prompt_entries is not None and entries is not None:
            entries = [*prompt_entries, *entries]
    choice = {"text": text, "index": out.index, "logprobs": render_logprobs(ctx, entries)}
    choice["finish_reason"] = out.finish_reason
    listed = prompt_logprobs.listed(ctx, out.prompt_index)
    if listed is not None:
        choice["prompt_logprobs"] = listed
    return choice


def chunk(ctx: RequestContext, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One streamed chunk; with ``include_usage``, ``usage`` is null on all but the last (as OpenAI sends it).

    With ``continuous_usage_stats`` (vLLM's) every chunk carries the usage so far: the tokens generated
    when the chunk is built (the engine may be a token or two ahead of the text it carries).
    """
    assert ctx.engine is not None
    body: dict[str, Any] = {
        "id": response_id(ctx),
        "object": "chat.completion.chunk" if ctx.is_chat else "text_completion",
        "created": ctx.created,
        "model": ctx.served_model,
        "system_fingerprint": system_fingerprint(ctx),
        "choices": choices,
    }
    if continuous_usage(ctx):
        body["usage"] = usage(ctx)
    elif wants_usage(ctx):
        body["usage"] = None
    body.update(extra)
    return body


def wants_usage(ctx: RequestContext) -> bool:
    """The client asked for a usage chunk (``stream_options.include_usage``)."""
    options = ctx.params.stream_options
    return bool(options and options.include_usage)


def continuous_usage(ctx: RequestContext) -> bool:
    """The client asked for usage on every chunk (``stream_options.continuous_usage_stats``, vLLM's)."""
    options = ctx.params.stream_options
    return bool(options and options.continuous_usage_stats)


def delta_choice(
    ctx: RequestContext,
    index: int,
    text: str | None = None,
    *,
    role: bool = False,
    extra: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if ctx.is_chat:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
            delta["content"] = ""
        if text is not None:
            delta["content"] = text
        if extra:
            delta.update(extra)
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"text": text or "", "index": index, "logprobs": logprobs, "finish_reason": finish_reason}
    variant = ctx.variant_of(index)
    if variant is not None:  # with_unsteered: on every chunk's choice
        choice[VARIANT] = variant
    return choice
