"""A streamed chat completion as the Responses stream events.

``response.created`` and ``response.in_progress`` first; then, for a thinking
block (a model that thinks), ``response.output_item.added`` (a reasoning item),
``response.content_part.added``, ``response.reasoning_text.delta``... and their
``.done`` events; for the text,
``response.output_item.added`` (a message), ``response.content_part.added``,
``response.output_text.delta``... and their ``.done`` events; for each function
call, ``response.output_item.added``, ``response.function_call_arguments.delta``
and ``.done``, ``response.output_item.done``; last ``response.completed`` (or
``response.incomplete`` when ``max_output_tokens`` ended it) carrying the whole
response, plugins' extras included. Every event has a ``sequence_number``. An
error the chat stream ends with becomes an ``error`` event, then
``response.failed``. Keep-alives (``None``) pass through; no ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

from ...context import RequestContext
from ..as_chat import ChunkWriter
from ..base import Chunks
from .render import (
    call_item,
    message_id,
    message_item,
    reasoning_id,
    reasoning_item,
    reasoning_part,
    response_object,
    text_part,
)
from .translate import Translation

#: The codes a failed response's ``error`` may carry (OpenAI's ``ResponseErrorCode``, those that can apply).
RESPONSE_ERROR_CODES = frozenset({"server_error", "rate_limit_exceeded", "invalid_prompt"})


class _Events(ChunkWriter):
    """The state of one stream: numbering, the open items, what was said."""

    def __init__(self, ctx: RequestContext, translation: Translation) -> None:
        super().__init__()
        self.ctx, self.translation = ctx, translation
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # finished items, in output order
        self.text: str | None = None  # the open message's text (None: no message open)
        self.text_index = 0
        self.text_done = False
        self.reasoning: str | None = None  # the open reasoning item's text (None: none open)
        self.reasoning_index = 0
        self.calls: dict[int, tuple[int, dict[str, Any]]] = {}  # chat index -> (output index, call so far)

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return event

    def snapshot(self, status: str) -> dict[str, Any]:
        return response_object(
            self.ctx,
            self.translation,
            status=status,
            output=list(self.output),
            finish_reason=self.finish_reason,
            extras=self.extras if status != "in_progress" else None,
        )

    @property
    def item_status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    def add_reasoning(self, delta: str) -> list[dict[str, Any]]:
        """Reasoning text: the first opens the reasoning item (before the message: the block comes first)."""
        events: list[dict[str, Any]] = []
        if self.reasoning is None:
            if self.text is not None or self.text_done or self.calls or self.output:
                return events  # the answer has begun: late reasoning has nowhere to go
            self.reasoning, self.reasoning_index = "", self._next_index()
            events += [
                self.event(
                    "response.output_item.added",
                    output_index=self.reasoning_index,
                    item=reasoning_item(self.ctx, "", "in_progress"),
                ),
                self.event(
                    "response.content_part.added",
                    item_id=reasoning_id(self.ctx),
                    output_index=self.reasoning_index,
                    content_index=0,
                    part=reasoning_part(""),
                ),
            ]
        self.reasoning += delta
        events.append(
            self.event(
                "response.reasoning_text.delta",
                item_id=reasoning_id(self.ctx),
                output_index=self.reasoning_index,
                content_index=0,
                delta=delta,
            )
        )
        return events

    def close_reasoning(self) -> list[dict[str, Any]]:
        if self.reasoning is None:
            return []
        text, index, item_id = self.reasoning, self.reasoning_index, reasoning_id(self.ctx)
        self.reasoning = None
        item = reasoning_item(self.ctx, text, self.item_status)
        self.output.insert(self._position(index), item)
        return [
            self.event("response.reasoning_text.done", item_id=item_id, output_index=index, content_index=0, text=text),
            self.event(
                "response.content_part.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=reasoning_part(text),
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def open_text(self) -> list[dict[str, Any]]:
        if self.text is not None or self.text_done:
            return []
        events = self.close_reasoning()
        self.text, self.text_index = "", self._next_index()
        item_id = message_id(self.ctx)
        return [
            *events,
            self.event(
                "response.output_item.added",
                output_index=self.text_index,
                item=message_item(self.ctx, "", "in_progress"),
            ),
            self.event(
                "response.content_part.added",
                item_id=item_id,
                output_index=self.text_index,
                content_index=0,
                part=text_part(""),
            ),
        ]

    def add_text(self, delta: str) -> list[dict[str, Any]]:
        events = self.open_text()
        if self.text is None:  # the message was closed by a call: late text has nowhere to go
            return events
        self.text += delta
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=message_id(self.ctx),
                output_index=self.text_index,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        )
        return events

    def close_text(self) -> list[dict[str, Any]]:
        if self.text is None:
            return []
        text, index, item_id = self.text, self.text_index, message_id(self.ctx)
        self.text, self.text_done = None, True
        item = message_item(self.ctx, text, self.item_status)
        self.output.insert(self._position(index), item)
        return [
            self.event(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self.event(
                "response.content_part.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                part=text_part(text),
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def add_call(self, fragment: dict[str, Any]) -> list[dict[str, Any]]:
        """A chat ``tool_calls`` delta entry: the first of an index opens the call, later ones add arguments."""
        index = fragment.get("index", len(self.calls))
        function = fragment.get("function") or {}
        events: list[dict[str, Any]] = []
        if index not in self.calls:
            events.extend(self.close_reasoning())
            events.extend(self.close_text())
            call = {"id": fragment.get("id"), "function": {"name": function.get("name", ""), "arguments": ""}}
            output_index = self._next_index()
            self.calls[index] = (output_index, call)
            events.append(
                self.event(
                    "response.output_item.added",
                    output_index=output_index,
                    item=call_item(self.ctx, index, call, "in_progress"),
                )
            )
        output_index, call = self.calls[index]
        arguments = function.get("arguments") or ""
        if arguments:
            call["function"]["arguments"] += arguments
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=call_item(self.ctx, index, call, "in_progress")["id"],
                    output_index=output_index,
                    delta=arguments,
                )
            )
        return events

    def close_calls(self) -> list[dict[str, Any]]:
        events = []
        for index, (output_index, call) in self.calls.items():
            item = call_item(self.ctx, index, call, "completed")
            self.output.insert(self._position(output_index), item)
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    name=item["name"],
                    output_index=output_index,
                    arguments=item["arguments"],
                )
            )
            events.append(self.event("response.output_item.done", output_index=output_index, item=item))
        self.calls = {}
        return events

    def _next_index(self) -> int:
        opened = len(self.output) + len(self.calls) + (self.text is not None) + (self.reasoning is not None)
        return opened

    def _position(self, output_index: int) -> int:
        return min(output_index, len(self.output))

    def finish(self) -> list[dict[str, Any]]:
        if not self.calls and self.text is None and not [i for i in self.output if i["type"] != "reasoning"]:
            events = self.open_text()  # an empty answer is still a message
        else:
            events = self.close_reasoning()
        events.extend(self.close_text())
        events.extend(self.close_calls())
        response = self.snapshot("completed")
        kind = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
        events.append(self.event(kind, response=response))
        return events

    def start(self) -> list[dict[str, Any]]:
        return [
            self.event("response.created", response=self.snapshot("in_progress")),
            self.event("response.in_progress", response=self.snapshot("in_progress")),
        ]

    def failed(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        param = self.translation.param(error.get("param"))
        response = self.snapshot("failed")
        # the response's error code is one of OpenAI's few; millm's own code is on the error event
        code = error.get("code") if error.get("code") in RESPONSE_ERROR_CODES else "server_error"
        response.update(status="failed", completed_at=None, error={"code": code, "message": error.get("message")})
        return [
            self.event("error", code=error.get("code"), message=error.get("message"), param=param),
            self.event("response.failed", response=response),
        ]


def response_events(chunks: Chunks, ctx: RequestContext, translation: Translation) -> Chunks:
    """The Responses events for a chat stream (see the module docstring); closes ``chunks`` when it ends."""
    return _Events(ctx, translation).written(chunks, ctx)
