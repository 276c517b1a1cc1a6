"""The request fields this plugin honours, as pydantic models, for ``/openapi.json``.

``response_format.py`` and ``tools/request.py`` do the validating (naming the
parameter, refusing what cannot be served); these models mirror what they accept.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class JsonSchemaFormat(BaseModel):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = Field(default=None, description='With type "json_schema"')


class FunctionDefinition(BaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = Field(default=None, description="A JSON Schema of the arguments")
    strict: bool | None = Field(
        default=None, description="Hold the parameters to the served schema subset (calls always follow them)"
    )


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class StructuredOutputFields(BaseModel):
    """What structured output adds to chat completions (engines that apply logits processors)."""

    response_format: ResponseFormat | None = Field(default=None, description="Constrain the reply to JSON")
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
