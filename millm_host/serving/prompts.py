"""Chats and completion prompts to token ids: the one way they are tokenized.

Shared by generation (``ServingChat``, ``ServingCompletion``) and scoring
(``ServingScoring``), which differ only in what they refuse. Call these on the
text thread (or the engine thread, for an engine without ``concurrent_text``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

from ..context import RequestContext
from ..errors import InvalidParameter, MillmError

T = TypeVar("T")


def chat_prompts(
    ctx: RequestContext, *, fallback: bool, refuse_unfitting: Callable[[int, int], None] | None = None
) -> list[list[int]]:
    """Every conversation rendered with the chat template and tokenized.

    ``fallback``: a model with no chat template gets a generic render (else
    ``NoChatTemplate`` is raised). The engine names ``messages`` in a refusal;
    one about an extra conversation is re-raised naming ``extra_messages[i]``.

    ``refuse_unfitting(index, least)`` is called for every conversation, before any is
    tokenized, with a lower bound on its tokens (``Engine.min_tokens``), to raise where
    it cannot fit. The bound is taken on the rendered text, the text tokenized: a
    template may drop or shorten what a message holds (earlier turns' reasoning), so a
    bound on the raw contents could refuse a chat that fits.
    """
    engine = ctx.engine
    assert engine is not None
    texts = [
        _naming_the_conversation(
            i,
            partial(
                engine.chat_text,
                conv,
                tools=ctx.chat_tools,
                template_kwargs=ctx.chat_template_kwargs,
                fallback=fallback,
            ),
        )
        for i, conv in enumerate(ctx.conversations)
    ]
    if refuse_unfitting is not None:
        for i, text in enumerate(texts):
            refuse_unfitting(i, engine.min_tokens([text]))
    return [_naming_the_conversation(i, partial(engine.tokenize_chat_text, text)) for i, text in enumerate(texts)]


def _naming_the_conversation(index: int, step: Callable[[], T]) -> T:
    """``step()``; a refusal naming ``messages`` re-raised naming ``extra_messages[index - 1]`` for an extra one."""
    try:
        return step()
    except InvalidParameter as exc:
        if index == 0 or exc.param != "messages":
            raise
        raise InvalidParameter(exc.message, param=f"extra_messages[{index - 1}]") from None


def completion_prompts(ctx: RequestContext) -> list[list[int]]:
    """Every completion prompt as token ids (a prompt sent as ids is taken as it is)."""
    engine = ctx.engine
    assert engine is not None
    add_special = ctx.params.add_special_tokens is not False
    return [
        list(p) if isinstance(p, list) else engine.tokenize(p, add_special_tokens=add_special)
        for p in ctx.params.prompts
    ]


def refuse_out_of_vocabulary(ctx: RequestContext, refusal: type[MillmError]) -> None:
    """Refuse (with ``refusal``) a prompt holding a token id outside the model's vocabulary."""
    assert ctx.engine is not None
    vocab = ctx.engine.info.vocab_size
    for ids in ctx.prompts:
        bad = [t for t in ids if t >= vocab]
        if bad:
            raise refusal(f"prompt: token id {bad[0]} is outside the vocabulary (size {vocab})", param="prompt")
