"""Request and response models of scoring mode (protocol only; the serving is ``.serving``).

The scoring serving builds its responses from these models, and
``docs/schemas/millm-scoring-api-v1.json`` is generated from them
(``python -m millm_host.schemas``), so the published schema is the server's own.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from ..protocol import FAIL_FAST, ChatCompletionRequest, CompletionRequest, ResponseModel

TopCount = Annotated[int, Field(ge=0, le=20)]
TokenIds = Annotated[
    list[int], Field(min_length=1, description="Token ids of the loaded model's vocabulary"), FAIL_FAST
]
PrecisionField = Annotated[
    Literal["native", "float32"] | None,
    Field(description='Precision of the scoring forward pass; "float32" scores a float32 copy of the model'),
]


# --- requests ------------------------------------------------------------------------


class ScoringCompletionRequest(CompletionRequest):
    """``POST /v1/completions`` in scoring mode: next-token log-probabilities, nothing generated.

    Scoring mode is ``logprobs`` or ``allowed_token_ids``, with ``max_tokens: 1``
    (or ``max_completion_tokens: 1``) and ``n: 1``.
    """

    logprobs: TopCount | None = Field(default=None, description="Alternatives to return for the next token, 0-20")
    allowed_token_ids: TokenIds | None = Field(
        default=None, description="Restrict the next token to these ids; log-probabilities are normalised over them"
    )
    return_tokens_as_token_ids: bool | None = Field(
        default=None, description='Key tokens by "token_id:<id>" instead of their decoded text'
    )
    scoring_precision: PrecisionField = None
    with_unsteered: SkipJsonSchema[bool | None] = None  # refused in scoring mode: not described


class ScoringChatRequest(ChatCompletionRequest):
    """``POST /v1/chat/completions`` in scoring mode (chat scoring)."""

    logprobs: bool | None = Field(default=None, description="Return the scored token's log-probability")
    top_logprobs: TopCount | None = Field(default=None, description="Most probable candidates to return, 0-20")
    allowed_token_ids: TokenIds | None = Field(
        default=None, description="Restrict the next token to these ids; log-probabilities are normalised over them"
    )
    return_tokens_as_token_ids: bool | None = Field(
        default=None, description='Key tokens by "token_id:<id>" instead of their decoded text'
    )
    with_unsteered: SkipJsonSchema[bool | None] = None  # refused in scoring mode: not described


# --- responses -----------------------------------------------------------------------


class Usage(ResponseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = Field(
        default=None, description="cached_tokens: prompt tokens the engine's prompt cache held"
    )
    completion_tokens_details: dict[str, int] | None = Field(
        default=None, description="reasoning_tokens: for a model that thinks, the tokens its thinking block took"
    )


class CompletionLogprobs(ResponseModel):
    """OpenAI's legacy completions ``logprobs``: one entry per returned token."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int] = Field(description="Character offset of each token within prompt plus completion")


class ScoringCompletionChoice(ResponseModel):
    text: str = Field(description="The most probable allowed token")
    index: int
    logprobs: CompletionLogprobs | None = Field(description="null with allowed_token_ids but no logprobs")
    finish_reason: Literal["length"]


class ScoringCompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ScoringCompletionChoice]
    usage: Usage
    scoring_precision: Literal["native", "float32"] | None = Field(
        default=None, description="The precision used; present only when the request sent scoring_precision"
    )


class ChatTopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] = Field(description="UTF-8 of the decoded token")


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(ResponseModel):
    content: list[ChatTokenLogprob] = Field(description="One entry: the scored token")
    refusal: None = None


class ScoringChatMessage(ResponseModel):
    role: Literal["assistant"]
    content: str
    refusal: None = None


class ScoringChatChoice(ResponseModel):
    index: int
    message: ScoringChatMessage
    logprobs: ChatLogprobs | None = Field(description="null unless logprobs: true")
    finish_reason: Literal["length"]


class ScoringChatResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str
    choices: list[ScoringChatChoice]
    usage: Usage


class ErrorObject(ResponseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(ResponseModel):
    """Every refusal (e.g. ``409 scoring_precision_unavailable``, reason in the message and in
    ``X-miLLM-Scoring-Precision-Reason``)."""

    error: ErrorObject
