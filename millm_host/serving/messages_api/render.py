"""The Anthropic message, from the chat completion that served the request."""

from __future__ import annotations

import json
from typing import Any

from ...context import RequestContext
from ..as_chat import extras_of

#: Chat finish reasons as Anthropic's stop reasons ("stop" is ``end_turn`` or ``stop_sequence``).
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}


def message_id(ctx: RequestContext) -> str:
    return f"msg_{ctx.request_id}"


def stop_sequence(ctx: RequestContext) -> str | None:
    """The stop sequence that ended the answer, if one did."""
    return ctx.outputs[0].stop_sequence if ctx.outputs else None


def stop_reason(ctx: RequestContext, finish_reason: str | None) -> str | None:
    if finish_reason is None:
        return None
    if finish_reason == "stop" and stop_sequence(ctx) is not None:
        return "stop_sequence"
    return STOP_REASONS.get(finish_reason, "end_turn")


def usage(ctx: RequestContext) -> dict[str, Any]:
    """``usage``: Anthropic counts the prompt tokens read from a cache apart from ``input_tokens``."""
    prompt = sum(len(p) for p in ctx.prompts)
    output = sum(len(o.token_ids) for o in ctx.outputs[:1])
    cached = (ctx.outputs[0].cached_tokens if ctx.outputs else None) or 0
    return {
        "input_tokens": prompt - cached,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_use_block(call: dict[str, Any]) -> dict[str, Any]:
    """A chat ``tool_calls`` entry as a ``tool_use`` block (its arguments parsed: ``input`` is an object)."""
    function = call.get("function") or {}
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name", ""), "input": tool_input(function)}


def tool_input(function: dict[str, Any]) -> dict[str, Any]:
    try:
        value = json.loads(function.get("arguments") or "{}")
    except ValueError:  # a cut call is dropped before it gets here; never answer with a broken block
        return {}
    return value if isinstance(value, dict) else {}


def thinking_block(text: str) -> dict[str, Any]:
    """A thinking model's block (``reasoning_content``); millm signs nothing, so its signature is empty."""
    return {"type": "thinking", "thinking": text, "signature": ""}


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The thinking (when the reply carries it), the text (when there is some), then each tool call."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append(thinking_block(message["reasoning_content"]))
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    blocks.extend(tool_use_block(call) for call in message.get("tool_calls") or ())
    return blocks


def message(
    ctx: RequestContext,
    content: list[dict[str, Any]],
    finish_reason: str | None,
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The message object (``finish_reason`` None: a stream's first snapshot, nothing generated yet)."""
    done = finish_reason is not None
    body: dict[str, Any] = {
        "id": message_id(ctx),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": ctx.served_model,
        "stop_reason": stop_reason(ctx, finish_reason),
        "stop_sequence": stop_sequence(ctx) if done else None,
        "usage": usage(ctx),
    }
    if extras:
        body.update(extras)
    return body


def from_completion(ctx: RequestContext, completion: dict[str, Any]) -> dict[str, Any]:
    """The message for a chat completion body (plugins' extras carried over)."""
    choice = completion["choices"][0]
    extras = extras_of(completion)
    return message(ctx, content_blocks(choice["message"]), choice["finish_reason"] or "stop", extras)
