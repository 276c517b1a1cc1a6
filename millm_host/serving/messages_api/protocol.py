"""The Messages request as the host validates it (its typed top-level fields), and the bodies it answers.

``messages`` and its content blocks, ``system`` blocks, ``tools`` and
``tool_choice`` are read by ``translate``, which names the offending location
itself (a long conversation is never validated twice). Anthropic's own names
are kept; the models are named ``Messages…`` so that ``/openapi.json`` keeps
them apart from the chat completion's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...protocol import FAIL_FAST, PositiveInt, TopP

#: Anthropic's temperature runs 0 to 1 (0: greedy).
MessagesTemperature = Annotated[float, Field(ge=0, le=1, description="0 = greedy. Range 0-1")]


class MessagesCountFields(BaseModel):
    """What ``POST /v1/messages/count_tokens`` takes besides ``messages``."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    system: str | Annotated[list[dict[str, Any]], FAIL_FAST] | None = Field(
        default=None, description="A string, or text blocks; becomes the conversation's system message"
    )
    tools: Annotated[list[dict[str, Any]], FAIL_FAST] | None = Field(
        default=None, description="Client tools: name, description, input_schema (JSON Schema of the input)"
    )
    tool_choice: dict[str, Any] | None = Field(
        default=None, description='{"type": "auto" | "any" | "none"} or {"type": "tool", "name": ...}'
    )
    output_config: dict[str, Any] | None = Field(
        default=None, description='format: {"type": "json_schema", "schema": {...}} constrains the answer'
    )


class MessagesFields(MessagesCountFields):
    """What ``POST /v1/messages`` takes besides ``messages``."""

    max_tokens: PositiveInt = Field(description="Most tokens to generate (required)")
    stop_sequences: Annotated[list[str], FAIL_FAST] | None = None
    stream: bool | None = False
    temperature: MessagesTemperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="1 (greedy) or 0 (no cut) is served; another top_k is refused unless greedy"
    )
    metadata: dict[str, Any] | None = Field(default=None, description="Accepted and unused (reported)")
    thinking: dict[str, Any] | None = Field(
        default=None,
        description='{"type": "enabled"} (or "adaptive"): a thinking model\'s block as thinking blocks; '
        '"disabled" or none: left out. budget_tokens is reported, not honoured',
    )


_MESSAGES = Field(
    min_length=1,
    description="user and assistant turns: a string, or content blocks (text, "
    "tool_use in an assistant turn, tool_result in a user turn)",
)


class MessagesRequest(MessagesFields):
    """``POST /v1/messages`` (Anthropic's Messages API)."""

    messages: Annotated[list[dict[str, Any]], _MESSAGES, FAIL_FAST]


class MessagesCountRequest(MessagesCountFields):
    """``POST /v1/messages/count_tokens``."""

    messages: Annotated[list[dict[str, Any]], _MESSAGES, FAIL_FAST]


class MessagesUsage(BaseModel):
    model_config = ConfigDict(extra="allow")

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class MessagesResponse(BaseModel):
    """An Anthropic ``message`` (plugins' extras, such as ``millm_probe_verdicts``, ride along)."""

    model_config = ConfigDict(extra="allow")

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[dict[str, Any]] = Field(
        description="thinking (a thinking model's, when asked for), text and tool_use blocks"
    )
    model: str
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: MessagesUsage


class MessagesStreamEvent(BaseModel):
    """One named stream event: message_start, content_block_start, content_block_delta, content_block_stop,
    message_delta, message_stop, ping, or error; the SSE ``event:`` is its ``type``."""

    model_config = ConfigDict(extra="allow")

    type: str


class MessagesTokenCount(BaseModel):
    """``POST /v1/messages/count_tokens``'s answer: the prompt's tokens, as ``usage.input_tokens`` counts them."""

    input_tokens: int


class MessagesErrorObject(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: str = Field(description="invalid_request_error, authentication_error, not_found_error, api_error, ...")
    message: str


class MessagesErrorResponse(BaseModel):
    """Every refusal on ``/v1/messages``, in Anthropic's shape (millm's ``code`` and ``param`` ride along)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["error"] = "error"
    error: MessagesErrorObject
