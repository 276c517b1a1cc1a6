"""``ServingResponses``: a Responses request served as the chat completion it translates to.

The context is the chat completion's (``ctx.endpoint == "chat.completions"``,
``ctx.body`` the translated chat body), so every plugin serves it as it serves
chat: steering and its headers, probe verdicts, structured output, tools.
Only the reading (``translate``) and the writing (``render``, ``events``) differ.
A refusal names the location in the Responses body (``text.format``, not
``response_format``).
"""

from __future__ import annotations

from typing import Any

from ...context import RequestContext
from ...openapi import Operation
from ..as_chat import ServingAsChat
from ..base import Result
from .events import response_events
from .protocol import ResponseObject, ResponsesRequest, ResponseStreamEvent
from .render import from_completion
from .translate import Translation, translate


class ServingResponses(ServingAsChat):
    """``POST /v1/responses`` (see the module docstring)."""

    #: The key of ``host.serving`` and the resource's endpoint name (the context's stays chat's).
    route = "responses"
    #: Stream events are named (``event: response.created``), as OpenAI sends them.
    named_events = True

    def describe(self) -> Operation:
        """``/openapi.json``: the Responses request and object, not the chat completion it is served as."""
        return Operation(
            summary="Create a model response (OpenAI's Responses API), served as a chat completion",
            request=(ResponsesRequest,),
            response=(ResponseObject,),
            stream=ResponseStreamEvent,
            errors=self.refusals,
            stream_done=False,
        )

    def translate(self, body: dict[str, Any], strict: bool) -> Translation:
        return translate(body, strict)

    def written(self, ctx: RequestContext, result: Result) -> Result:
        """The chat completion, rendered as a Responses object or its stream of events."""
        translation: Translation = ctx.plan
        if result.stream is not None:
            return Result(headers=result.headers, stream=response_events(result.stream, ctx, translation))
        assert result.body is not None
        return Result(headers=result.headers, body=from_completion(ctx, translation, result.body))
