"""The Responses request as the host validates it: the typed top-level fields.

Input items, tools and ``text.format`` are read by ``translate``, which names
the offending location itself; everything else is left to the field rules.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from ...protocol import FAIL_FAST, PositiveInt, Temperature, TopP


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    input: str | Annotated[list[dict[str, Any]], Field(min_length=1), FAIL_FAST]
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = False
    tools: Annotated[list[dict[str, Any]], FAIL_FAST] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None


class ResponseUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class ResponseObject(BaseModel):
    """A Responses API ``response`` object (the fields millm sets; OpenAI's ``Response`` in full)."""

    model_config = ConfigDict(extra="allow")

    id: str
    object: str = "response"
    created_at: float
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: ResponseUsage | None = None


class ResponseStreamEvent(BaseModel):
    """One named stream event (``response.created``, ``response.output_text.delta``, ...)."""

    model_config = ConfigDict(extra="allow")

    type: str
    sequence_number: int
