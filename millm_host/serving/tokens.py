"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes): the server's own tokenization, shown.

A prompt is tokenized as ``/v1/completions`` tokenizes one, a chat as
``/v1/chat/completions`` renders and tokenizes it (the same template path, one
BOS), so ``count`` is the ``usage.prompt_tokens`` generation reports. Both go
through the ``Serving`` lifecycle like every endpoint (model resolution,
admission, plugin hooks, errors); the text work runs on the text thread and
nothing runs on the engine thread.

Off the event loop is not enough for long inputs: a worker thread's C call that holds the
GIL stalls the loop as surely. ``/detokenize`` of 500,000 ids checks their range a slice at
a time and frees them on a thread of their own (``bodies.release``); the engine's ``detokenize`` keeps its own
decode short on the GIL (the transformers engine: ``decode_batch``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..admission import Admission
from ..bodies import release
from ..context import RequestContext
from ..errors import InvalidParameter
from ..protocol import DetokenizeRequest, TokenizeRequest
from ..response_bodies import DetokenizeResponse, TokenizeResponse
from .base import Result, Serving, add_extras
from .chat import _conversation, _full_messages  # chat's own reading: what it renders, tokenize renders
from .prompts import chat_prompts


class TextOnlyServing(Serving):
    """A request answered from the tokenizer alone: ``tokenize`` does the work, ``render`` writes it."""

    async def respond(self, ctx: RequestContext, admission: Admission, watcher: asyncio.Future | None) -> Result:
        admission.release()
        if watcher is not None:
            watcher.cancel()
        ctx.finished = True
        body = add_extras(self.host, ctx, self.render(ctx, None))
        return Result(headers=self.headers(ctx), body=body)


class ServingTokenize(TextOnlyServing):
    """``/tokenize``: a prompt or a chat to the ids generation would run on."""

    endpoint = "tokenize"
    protocol = TokenizeRequest
    response_model = TokenizeResponse

    def read(self, ctx: RequestContext) -> None:
        messages = ctx.params.messages
        if messages is not None:
            ctx.conversations = [_conversation(messages)]
            ctx.messages = [_full_messages(messages)]

    def tokenize(self, ctx: RequestContext) -> None:
        engine = ctx.engine
        assert engine is not None
        params = ctx.params
        if params.messages is not None:
            ctx.prompts = chat_prompts(ctx, fallback=True)  # as chat completions: a model without a template too
        else:
            ctx.prompts = [engine.tokenize(params.prompt, add_special_tokens=params.add_special_tokens is not False)]
        if params.return_token_strs:
            ctx.plan = [engine.detokenize([t]) for t in ctx.prompts[0]]

    def render(self, ctx: RequestContext, output: Any) -> dict[str, Any]:
        assert ctx.engine is not None
        ids = ctx.prompts[0]
        response = TokenizeResponse(
            count=len(ids), max_model_len=ctx.engine.info.context_window, tokens=ids, token_strs=ctx.plan
        )
        return response.model_dump(mode="json", exclude_none=ctx.plan is None)


class ServingDetokenize(TextOnlyServing):
    """``/detokenize``: token ids to text, special tokens kept (``/tokenize`` of a chat round-trips)."""

    endpoint = "detokenize"
    protocol = DetokenizeRequest
    response_model = DetokenizeResponse

    def tokenize(self, ctx: RequestContext) -> None:
        engine = ctx.engine
        assert engine is not None
        vocab = engine.info.vocab_size
        tokens = ctx.params.tokens
        for start in range(0, len(tokens), RANGE_SLICE):  # one C call a slice (max), not a Python step an id
            chunk = tokens[start : start + RANGE_SLICE]
            if max(chunk) >= vocab:
                j, token = next((start + i, t) for i, t in enumerate(chunk) if t >= vocab)
                raise InvalidParameter(
                    f"tokens[{j}]: token id {token} is outside this model's vocabulary (ids 0-{vocab - 1})",
                    param=f"tokens[{j}]",
                )
        ctx.prompts = [list(tokens)]
        release.keep_if_long(ctx.prompts[0])  # 500,000 ids freed on the event loop held it for ms
        ctx.plan = engine.detokenize(ctx.prompts[0])  # the engine's to keep short on the GIL

    def render(self, ctx: RequestContext, output: Any) -> dict[str, Any]:
        return DetokenizeResponse(prompt=ctx.plan).model_dump(mode="json")


#: Ids whose range one C call (``max``) checks: a Python step an id took tens of ms for 500,000.
RANGE_SLICE = 4096
