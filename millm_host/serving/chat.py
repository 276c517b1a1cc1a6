"""``POST /v1/chat/completions``: ``ServingChat`` (scoring-mode bodies go to its ``ServingScoring``)."""

from __future__ import annotations

from typing import Any

from ..bodies.validate import VALIDATION_SLICE
from ..context import RequestContext
from ..errors import InvalidParameter
from ..protocol import ChatCompletionRequest, ChatMessage, message_text
from ..reasoning import ReasoningPlan, model_markers, opens_in_prompt
from ..response_bodies import ChatCompletionChunk, ChatCompletionResponse
from .prompts import chat_prompts
from .run import ServingGeneration


class ServingChat(ServingGeneration):
    """Chat completions: conversations (``messages``, ``extra_messages``) through the chat template."""

    endpoint = "chat.completions"
    protocol = ChatCompletionRequest
    response_model = ChatCompletionResponse
    chunk_model = ChatCompletionChunk

    def read(self, ctx: RequestContext) -> None:
        """The conversations, as the template sees them (``ctx.conversations``) and in full (``ctx.messages``)."""
        params = ctx.params
        ctx.conversations = [_conversation(params.messages)]
        ctx.messages = [_full_messages(params.messages)]
        extra = ctx.body.get("extra_messages")
        if extra is not None and not isinstance(extra, list):
            raise InvalidParameter("extra_messages must be a list of conversations", param="extra_messages")
        for i, rows in enumerate(extra or ()):
            messages = _extra_messages(rows, i)
            ctx.conversations.append(_conversation(messages))
            ctx.messages.append(_full_messages(messages))
        ctx.chat_template_kwargs = ctx.body.get("chat_template_kwargs")
        if ctx.chat_template_kwargs is not None and not isinstance(ctx.chat_template_kwargs, dict):
            raise InvalidParameter("chat_template_kwargs must be an object", param="chat_template_kwargs")
        ctx.include_reasoning = params.include_reasoning is not False
        super().read(ctx)

    def refuse_unfitting_text(self, ctx: RequestContext) -> None:
        """Done in ``tokenize``, on each rendered conversation (``chat_prompts``): a template may drop content."""

    def tokenize(self, ctx: RequestContext) -> None:
        ctx.prompts = chat_prompts(  # a model with no template gets a generic render
            ctx, fallback=True, refuse_unfitting=lambda _, least: self.refuse_at_least(ctx, least)
        )
        engine = ctx.engine
        assert engine is not None
        markers = model_markers(ctx.settings["MILLM_REASONING"], engine.info.chat_template)
        if markers is not None:  # a model that thinks: its replies are split (``millm_host.reasoning``)
            inside = tuple(opens_in_prompt(engine.decode, prompt, markers) for prompt in ctx.prompts)
            ctx.reasoning = ReasoningPlan(markers, inside)


def _conversation(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as the chat template sees them: role and text content."""
    return [{"role": message.role, "content": message_text(message, i)} for i, message in enumerate(messages)]


def _full_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as sent, every field kept (``tool_calls``, ``tool_call_id``, ``name``)."""
    return [_dumped(message) for message in messages]


def _dumped(message: ChatMessage) -> dict[str, Any]:
    """One message as a dict; a long list of content parts part by part (one call would hold the GIL throughout)."""
    if isinstance(message.content, list) and len(message.content) > VALIDATION_SLICE:
        out = message.model_dump(exclude_unset=True, exclude={"content"})
        out["content"] = [part.model_dump(exclude_unset=True) for part in message.content]
        return out
    return message.model_dump(exclude_unset=True)


def _extra_messages(rows: Any, index: int) -> list[ChatMessage]:
    if not isinstance(rows, list) or not rows:
        raise InvalidParameter(
            "each extra_messages entry must be a non-empty list of messages", param=f"extra_messages[{index}]"
        )
    try:
        return [ChatMessage.model_validate(m) for m in rows]
    except Exception:
        raise InvalidParameter("extra_messages holds an invalid message", param=f"extra_messages[{index}]") from None
