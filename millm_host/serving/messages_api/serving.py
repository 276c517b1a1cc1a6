"""``ServingMessages`` and ``ServingCountTokens``: a Messages request served as the chat completion it translates to.

The context is the chat completion's (``ctx.endpoint == "chat.completions"``,
``ctx.body`` the translated chat body), so every plugin serves it as it serves
chat: steering and its headers, probe verdicts, structured output and tools.
Only the reading (``translate``) and the writing (``render``, ``events``) differ.
A refusal names the location in the Messages body (``stop_sequences``, not
``stop``); the resource's error handler writes it in Anthropic's shape.

``count_tokens`` goes the same way up to tokenizing (the tools rendered into the
prompt as generation would render them) and answers the count: nothing is generated.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ...admission import Admission
from ...bodies.validate import refuse_long_chat
from ...context import RequestContext
from ...openapi import Operation
from ..as_chat import ServingAsChat
from ..base import Result
from .events import message_events
from .protocol import (
    MessagesCountRequest,
    MessagesErrorResponse,
    MessagesRequest,
    MessagesResponse,
    MessagesStreamEvent,
    MessagesTokenCount,
)
from .render import from_completion
from .translate import Translation, translate


class ServingMessages(ServingAsChat):
    """``POST /v1/messages`` (see the module docstring)."""

    #: The key of ``host.serving`` and the resource's endpoint name (the context's stays chat's).
    route = "messages"
    #: Stream events are named (``event: message_start``), as Anthropic sends them.
    named_events = True
    #: Whether the body is count_tokens' (nothing generated, ``max_tokens`` not asked for).
    counting = False

    def describe(self) -> Operation:
        """``/openapi.json``: the Messages request and message, not the chat completion it is served as."""
        return Operation(
            summary="Create a message (Anthropic's Messages API), served as a chat completion",
            request=(MessagesRequest,),
            response=(MessagesResponse,),
            stream=MessagesStreamEvent,
            errors=self.refusals,
            error=MessagesErrorResponse,
            stream_done=False,
        )

    def translate(self, body: dict[str, Any], strict: bool) -> Translation:
        settings = self.host.settings
        # before any block is read: the same bounds as a chat's messages and parts
        refuse_long_chat(body, settings["MILLM_MAX_MESSAGES"], settings["MILLM_MAX_CONTENT_PARTS"])
        return translate(body, strict, counting=self.counting)

    def written(self, ctx: RequestContext, result: Result) -> Result:
        """The chat completion, written as a message or its stream of events (count_tokens: as it is)."""
        if result.stream is not None:
            return Result(headers=result.headers, stream=message_events(result.stream, ctx))
        assert result.body is not None
        if self.counting:
            return result
        return Result(headers=result.headers, body=from_completion(ctx, result.body))


class ServingCountTokens(ServingMessages):
    """``POST /v1/messages/count_tokens``: the prompt a Messages body would run on, counted."""

    route = "messages.count_tokens"
    counting = True

    def describe(self) -> Operation:
        return Operation(
            summary="Count the input tokens of a message (Anthropic's count_tokens)",
            request=(MessagesCountRequest,),
            response=(MessagesTokenCount,),
            errors=self.refusals,
            error=MessagesErrorResponse,
        )

    def streams(self, params: Any) -> bool:
        return False

    def check(self, ctx: RequestContext) -> None:
        """Nothing is generated: no window to fit a completion into, no sampling to settle."""

    async def respond(self, ctx: RequestContext, admission: Admission, watcher: asyncio.Future | None) -> Result:
        admission.release()
        if watcher is not None:
            watcher.cancel()
        ctx.finished = True
        # the count alone: no plugin's extras, which speak of a generation
        return Result(headers=self.headers(ctx), body={"input_tokens": sum(len(p) for p in ctx.prompts)})
