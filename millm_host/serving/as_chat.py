"""APIs served as chat completions (OpenAI's Responses API, Anthropic's Messages API): what they share.

Each translates its body into a chat body, by ``FieldRules`` it declares (fields it
refuses, reports as unused, or passes on to the chat rules), builds the chat
completion's context from it, serves it as chat, and writes the result in its own
terms (``ServingAsChat.written``; a stream through a ``ChunkWriter``). A refusal
names the field as the client sent it (``named_as_sent``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..context import RequestContext
from ..errors import FieldNotHonoured, MillmError, UnusedFieldsRefused
from ..fields import is_no_change, strict_mode
from .base import Chunks, ClientGone, Result
from .chat import ServingChat

#: Keys of a chat completion (or chunk) that such an API says in its own way; any other key is a
#: plugin's extra (``millm_steering``, probe verdicts) and is carried over as it is.
CHAT_KEYS = frozenset(
    {"id", "object", "created", "model", "choices", "usage", "system_fingerprint", "service_tier", "error"}
)


def extras_of(body: dict[str, Any]) -> dict[str, Any]:
    """The plugins' extras of a chat completion or chunk (its keys outside ``CHAT_KEYS``)."""
    return {key: value for key, value in body.items() if key not in CHAT_KEYS}


class ChunkWriter:
    """A chat stream written as another API's events: choice 0's deltas become events, in order
    (``add_reasoning``, ``add_text``, ``add_call``); its finish reason and the plugins' extras are kept."""

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.extras: dict[str, Any] = {}

    def add_reasoning(self, text: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def add_text(self, text: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def add_call(self, fragment: dict[str, Any]) -> list[dict[str, Any]]:
        """A chat ``tool_calls`` delta entry."""
        raise NotImplementedError

    def start(self) -> list[dict[str, Any]]:
        """The events before any chunk."""
        raise NotImplementedError

    def failed(self, error: dict[str, Any]) -> list[dict[str, Any]]:
        """The events for the error a chat stream ended with (the stream ends there)."""
        raise NotImplementedError

    def finish(self) -> list[dict[str, Any]]:
        """The events after the last chunk."""
        raise NotImplementedError

    #: What a keep-alive (a None from the chat stream) is written as.
    keep_alive: dict[str, Any] | None = None

    async def written(self, chunks: Chunks, ctx: RequestContext) -> Chunks:
        """The events for a chat stream; closes ``chunks`` when it ends. No ``[DONE]``: such streams end
        with their last event."""
        try:
            for event in self.start():
                yield event
            async for item in chunks:
                if item is None:
                    yield self.keep_alive  # lets the server notice a client that went away
                    continue
                if isinstance(item, str):  # "[DONE]"
                    continue
                if "error" in item:
                    for event in self.failed(item["error"]):
                        yield event
                    return
                for event in self.chunk(item):
                    yield event
            if ctx.interrupted == "client_disconnected":
                return  # nobody reads what would follow
            for event in self.finish():
                yield event
        finally:
            await chunks.aclose()

    def chunk(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events one chat chunk makes."""
        self.extras.update(extras_of(chunk))
        events: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                events.extend(self.add_reasoning(delta["reasoning_content"]))
            if delta.get("content"):
                events.extend(self.add_text(delta["content"]))
            for fragment in delta.get("tool_calls") or ():
                events.extend(self.add_call(fragment))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events


@contextmanager
def named_as_sent(rename: Callable[[str | None], str | None]) -> Iterator[None]:
    """A ``MillmError`` raised inside names the sent body's field (``rename(param)``), not the chat body's it became."""
    try:
        yield
    except MillmError as exc:
        if exc.param is not None:
            renamed = rename(exc.param)
            if renamed != exc.param:  # the message names the chat field too: name the sent one
                exc.message = exc.message.replace(exc.param, renamed or "", 1)
                exc.args = (exc.message,)
            exc.param = renamed
        raise


@dataclass(frozen=True)
class FieldRules:
    """How an API's top-level fields meet the chat body: refused, reported, translated, or passed on."""

    #: The route, for messages (``/v1/responses``).
    route: str
    #: Refused where they would change the answer: name -> (asks nothing of this value?, why not).
    refused: Mapping[str, tuple[Callable[[Any], bool], str]]
    #: Accepted and reported unused (``X-miLLM-Ignored-Fields``) unless the value asks nothing.
    reported: Mapping[str, Callable[[Any], bool]]
    #: Chat completions' names for what this API names otherwise: name -> what to send instead (or None).
    chat_names: Mapping[str, str | None]
    #: The fields the translation reads itself.
    translated: frozenset[str]

    def refuse(self, body: dict[str, Any]) -> None:
        """Raise ``field_not_honoured`` for the first refused field, or chat name, that asks something."""
        for name, (asks_nothing, why) in self.refused.items():
            if name in body and not asks_nothing(body[name]):
                raise FieldNotHonoured(f"{name} cannot be honoured on {self.route}: {why}", param=name)
        for name, instead in self.chat_names.items():
            if name in body and not is_no_change(name, body[name]):
                hint = f"; send {instead}" if instead else ""
                raise FieldNotHonoured(
                    f"{name} is a chat completions field, not served on {self.route}{hint}", param=name
                )

    def reported_in(self, body: dict[str, Any]) -> list[str]:
        """The reported fields ``body`` carries with a value that asks something."""
        return [name for name, asks_nothing in self.reported.items() if name in body and not asks_nothing(body[name])]

    def pass_on(self, body: dict[str, Any], chat: dict[str, Any]) -> None:
        """millm's own fields (``steering``, ``seed``...) and anything unknown: the chat rules decide."""
        for name, value in body.items():
            if name not in self.translated and name not in self.reported and name not in self.refused:
                chat[name] = value

    @staticmethod
    def refuse_unused(strict: bool, reported: list[str]) -> None:
        """``X-miLLM-Strict``: a request carrying fields nothing uses is refused."""
        if strict and reported:
            raise UnusedFieldsRefused(
                "X-miLLM-Strict refuses fields this request path does not use: " + ", ".join(reported),
                param=reported[0],
            )


@dataclass
class Translation:
    """A body translated: the chat body, what was reported, and how to name chat locations back.

    Each API's subclass says where its body keeps the turns (``turns``: ``input``,
    ``messages``), which chat names it names otherwise (``renames``), and how it names a
    tool's location (``tool_param``).
    """

    #: Where the sent body keeps its turns: a chat message's location is named from there.
    turns: ClassVar[str]
    #: (chat location, sent location) prefixes, the longest first.
    renames: ClassVar[tuple[tuple[str, str], ...]] = ()

    request: Any  # the validated request model
    chat: dict[str, Any]
    reported: list[str] = field(default_factory=list)
    #: The sent location of each chat message (``instructions``, ``input[3]``, ``system``).
    sources: list[str] = field(default_factory=list)

    def param(self, chat_param: str | None) -> str | None:
        """A chat location named as the request sent it (``messages[1].content`` → ``input[0].content``)."""
        if chat_param is None:
            return None
        return ", ".join(self._one(p.strip()) for p in chat_param.split(","))

    def _one(self, param: str) -> str:
        match = re.match(r"messages\[(\d+)\](.*)", param, re.S)
        if match:
            index = int(match.group(1))
            where = self.sources[index] if index < len(self.sources) else self.turns
            return where + (match.group(2) if where.startswith(self.turns + "[") else "")
        for chat, sent in self.renames:
            if param == chat or param.startswith((chat + ".", chat + "[", chat + "/")):
                return sent + param[len(chat) :]
        return self.tool_param(param)

    def tool_param(self, param: str) -> str:
        """A chat tool's location as sent: ``tools[0].function.name`` → ``tools[0].name``."""
        return re.sub(r"^tools\[(\d+)\]\.function", r"tools[\1]", param)


class ServingAsChat(ServingChat):
    """An API served as a chat completion: ``translate`` its body, ``written`` its result."""

    def translate(self, body: dict[str, Any], strict: bool) -> Translation:
        """The chat body for ``body``; raises a ``MillmError`` naming the sent location."""
        raise NotImplementedError

    def written(self, ctx: RequestContext, result: Result) -> Result:
        """The chat completion's result (a body or a stream) in this API's terms."""
        raise NotImplementedError

    def scoring_for(self, body: dict[str, Any]) -> None:
        """Such a body is never scoring mode."""
        return None

    def build_context(self, body: dict[str, Any], headers: dict[str, str]) -> RequestContext:
        """The chat completion's context, built from the translated body (worker thread for a large body)."""
        translation = self.translate(body, strict_mode(headers))
        with named_as_sent(translation.param):
            ctx = super().build_context(translation.chat, headers)
        ctx.plan = translation
        ctx.unused_fields = [*translation.reported, *ctx.unused_fields]
        return ctx

    async def serve(self, ctx: RequestContext, gone: ClientGone | None = None) -> Result:
        """The chat completion, written in this API's terms."""
        with named_as_sent(ctx.plan.param):
            result = await super().serve(ctx, gone)
        return self.written(ctx, result)
