"""The response object and its output items, from the chat completion that served the request."""

from __future__ import annotations

import time
from typing import Any

from ...context import RequestContext
from ..as_chat import extras_of
from .translate import Translation


def response_id(ctx: RequestContext) -> str:
    return f"resp_{ctx.request_id}"


def message_id(ctx: RequestContext) -> str:
    return f"msg_{ctx.request_id}"


def reasoning_id(ctx: RequestContext) -> str:
    return f"rs_{ctx.request_id}"


def call_item_id(ctx: RequestContext, index: int) -> str:
    return f"fc_{ctx.request_id}_{index}"


def usage(ctx: RequestContext) -> dict[str, Any]:
    """``usage``; ``cached_tokens`` is what the engine's prompt cache held (GGUF's prompt reuse), as the
    chat completion's ``prompt_tokens_details`` says it."""
    prompt = sum(len(p) for p in ctx.prompts)
    output = sum(len(o.token_ids) for o in ctx.outputs[:1])
    cached = ctx.outputs[0].cached_tokens if ctx.outputs else None
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached or 0, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": ctx.outputs[0].reasoning_tokens if ctx.outputs else 0},
        "total_tokens": prompt + output,
    }


def message_item(ctx: RequestContext, text: str, status: str) -> dict[str, Any]:
    content = [text_part(text)] if status != "in_progress" else []
    return {"id": message_id(ctx), "type": "message", "role": "assistant", "status": status, "content": content}


def reasoning_item(ctx: RequestContext, text: str, status: str) -> dict[str, Any]:
    """A model's thinking block as OpenAI's ``reasoning`` item: its text as ``reasoning_text`` content, no summary."""
    content = [reasoning_part(text)] if status != "in_progress" else []
    return {
        "id": reasoning_id(ctx),
        "type": "reasoning",
        "summary": [],
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(ctx: RequestContext, index: int, call: dict[str, Any], status: str) -> dict[str, Any]:
    """A chat ``tool_calls`` entry as a ``function_call`` output item."""
    function = call.get("function") or {}
    return {
        "id": call_item_id(ctx, index),
        "type": "function_call",
        "call_id": call.get("id") or call_item_id(ctx, index),
        "name": function.get("name", ""),
        "arguments": function.get("arguments", "") if status != "in_progress" else "",
        "status": status,
    }


def output_items(ctx: RequestContext, message: dict[str, Any], finish_reason: str | None) -> list[dict[str, Any]]:
    """The reasoning (a model that thinks, unless ``include_reasoning`` is false), the assistant message (when
    it has text) then each function call, as output items."""
    status = "incomplete" if finish_reason == "length" else "completed"
    items = []
    if message.get("reasoning_content"):
        items.append(reasoning_item(ctx, message["reasoning_content"], status))
    text = message.get("content")
    calls = message.get("tool_calls") or []
    if text or not calls:
        items.append(message_item(ctx, text or "", status))
    items.extend(call_item(ctx, i, call, "completed") for i, call in enumerate(calls))
    return items


def response_object(
    ctx: RequestContext,
    translation: Translation,
    *,
    status: str,
    output: list[dict[str, Any]],
    finish_reason: str | None = None,
    extras: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The response object in a given state (``in_progress`` while streaming, then final)."""
    request, body = translation.request, ctx.body
    done = status != "in_progress"
    if done and finish_reason == "length":
        status = "incomplete"
    obj: dict[str, Any] = {
        "id": response_id(ctx),
        "object": "response",
        "created_at": ctx.created,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": ctx.served_model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": None,
        "store": False,
        "temperature": 1.0 if request.temperature is None else request.temperature,
        "text": {"format": _text_format(request.text)},
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": [echo_tool(tool) for tool in request.tools or ()],
        "top_p": 1.0 if request.top_p is None else request.top_p,
        "truncation": "disabled",
        "metadata": dict(request.metadata or {}),
    }
    if done:
        obj["usage"] = usage(ctx)
    if body.get("seed") is not None:
        obj["seed"] = body["seed"]
    if extras:
        obj.update(extras)
    return obj


def echo_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as the response lists it, ``strict`` as the request sent it (a strict tool served is honoured)."""
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict") is True,
    }


def _text_format(text: dict[str, Any] | None) -> dict[str, Any]:
    fmt = (text or {}).get("format")
    return fmt if isinstance(fmt, dict) else {"type": "text"}


def from_completion(ctx: RequestContext, translation: Translation, completion: dict[str, Any]) -> dict[str, Any]:
    """The response object for a chat completion body (plugins' extras carried over)."""
    choice = completion["choices"][0]
    extras = extras_of(completion)
    return response_object(
        ctx,
        translation,
        status="completed",
        output=output_items(ctx, choice["message"], choice["finish_reason"]),
        finish_reason=choice["finish_reason"],
        extras=extras,
    )
