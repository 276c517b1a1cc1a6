"""A streamed chat completion as Anthropic's Messages stream events.

``message_start`` first (the message with no content, its ``input_tokens``
known); then a block at a time: ``content_block_start``, its
``content_block_delta``s (``thinking_delta`` for a thinking model's block,
``text_delta`` for text, ``input_json_delta`` for a tool call's input, sent as
it is generated) and ``content_block_stop``; last
``message_delta`` (``stop_reason``, ``stop_sequence``, ``usage``, and the
plugins' extras such as ``millm_probe_verdicts``) and ``message_stop``. A
keep-alive is a ``ping``. An error the chat stream ends with becomes an
``error`` event, and the stream ends there. No ``[DONE]``.
"""

from __future__ import annotations

from typing import Any

from ...context import RequestContext
from ..as_chat import ChunkWriter
from ..base import Chunks
from .errors import stream_error
from .render import message, stop_reason, stop_sequence, thinking_block, usage

PING = {"type": "ping"}


class _Events(ChunkWriter):
    """The state of one stream: the open block, the calls' block indexes, what was said."""

    def __init__(self, ctx: RequestContext) -> None:
        super().__init__()
        self.ctx = ctx
        self.blocks = 0  # blocks opened so far (the next one's index)
        self.open: int | None = None  # the open block's index
        self.open_kind: str | None = None  # the open block's type: thinking, text or tool_use
        self.calls: dict[int, int] = {}  # chat tool call index -> block index

    keep_alive = PING

    def start(self) -> list[dict[str, Any]]:
        snapshot = message(self.ctx, [], None)
        snapshot["usage"]["output_tokens"] = 0
        return [{"type": "message_start", "message": snapshot}]

    def failed(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        return [stream_error(error)]

    def close(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        index, self.open, self.open_kind = self.open, None, None
        return [{"type": "content_block_stop", "index": index}]

    def begin(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self.close()
        self.open, self.blocks = self.blocks, self.blocks + 1
        self.open_kind = block["type"]
        events.append({"type": "content_block_start", "index": self.open, "content_block": block})
        return events

    def add_text(self, text: str) -> list[dict[str, Any]]:
        events = [] if self.open_kind == "text" else self.begin({"type": "text", "text": ""})
        events.append(
            {"type": "content_block_delta", "index": self.open, "delta": {"type": "text_delta", "text": text}}
        )
        return events

    def add_reasoning(self, text: str) -> list[dict[str, Any]]:
        events = [] if self.open_kind == "thinking" else self.begin(thinking_block(""))
        delta = {"type": "thinking_delta", "thinking": text}
        events.append({"type": "content_block_delta", "index": self.open, "delta": delta})
        return events

    def add_call(self, fragment: dict[str, Any]) -> list[dict[str, Any]]:
        """A chat ``tool_calls`` delta entry: the first of an index opens a ``tool_use`` block, later ones add input."""
        index = fragment.get("index", len(self.calls))
        function = fragment.get("function") or {}
        events: list[dict[str, Any]] = []
        if index not in self.calls:
            block = {"type": "tool_use", "id": fragment.get("id"), "name": function.get("name", ""), "input": {}}
            events.extend(self.begin(block))
            self.calls[index] = self.blocks - 1
        arguments = function.get("arguments") or ""
        if arguments:
            delta = {"type": "input_json_delta", "partial_json": arguments}
            events.append({"type": "content_block_delta", "index": self.calls[index], "delta": delta})
        return events

    def finish(self) -> list[dict[str, Any]]:
        events = self.close()
        ctx = self.ctx
        final = {"stop_reason": stop_reason(ctx, self.finish_reason or "stop"), "stop_sequence": stop_sequence(ctx)}
        events.append({"type": "message_delta", "delta": final, "usage": usage(ctx), **self.extras})
        events.append({"type": "message_stop"})
        return events


def message_events(chunks: Chunks, ctx: RequestContext) -> Chunks:
    """The Messages events for a chat stream (see the module docstring); closes ``chunks`` when it ends."""
    return _Events(ctx).written(chunks, ctx)
