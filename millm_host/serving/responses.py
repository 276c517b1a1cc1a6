"""OpenAI-shaped bodies and chunks for chat and text completions."""

from __future__ import annotations

from typing import Any

from ..context import RequestContext
from ..default_fields import seed_scope
from .logprobs import render as render_logprobs


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


def usage(ctx: RequestContext) -> dict[str, int]:
    prompt = sum(len(p) for p in ctx.prompts)
    completion = sum(len(o.token_ids) for o in ctx.outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(ctx: RequestContext) -> dict[str, Any]:
    """The non-streaming response for a chat or text completion."""
    assert ctx.engine is not None
    choices: list[dict[str, Any]] = []
    for out in ctx.outputs:
        if ctx.is_chat:
            message: dict[str, Any] = {"role": "assistant", "content": out.text, "refusal": None}
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
            choices.append(
                {
                    "text": out.text,
                    "index": out.index,
                    "logprobs": render_logprobs(ctx, out.logprobs),
                    "finish_reason": out.finish_reason,
                }
            )
    return {
        "id": response_id(ctx),
        "object": "chat.completion" if ctx.is_chat else "text_completion",
        "created": ctx.created,
        "model": ctx.model.id,
        "system_fingerprint": system_fingerprint(ctx),
        "choices": choices,
        "usage": usage(ctx),
    }


def chunk(ctx: RequestContext, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """One streamed chunk; with ``include_usage``, ``usage`` is null on all but the last (as OpenAI sends it)."""
    assert ctx.engine is not None
    body: dict[str, Any] = {
        "id": response_id(ctx),
        "object": "chat.completion.chunk" if ctx.is_chat else "text_completion",
        "created": ctx.created,
        "model": ctx.model.id,
        "system_fingerprint": system_fingerprint(ctx),
        "choices": choices,
    }
    if wants_usage(ctx):
        body["usage"] = None
    body.update(extra)
    return body


def wants_usage(ctx: RequestContext) -> bool:
    """The client asked for a usage chunk (``stream_options.include_usage``)."""
    options = ctx.params.stream_options
    return bool(options and options.include_usage)


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
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return {"text": text or "", "index": index, "logprobs": logprobs, "finish_reason": finish_reason}
