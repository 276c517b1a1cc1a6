"""Response bodies of the OpenAI endpoints and of the host's own routes, as pydantic models.

``/openapi.json`` publishes them, and tests hold real responses to them
(``tests/test_openapi_document.py``), so the document says what is sent.
Bodies that plugins extend (``millm_steering``, ``millm_probe_verdicts``, a
message's ``tool_calls``) allow extra keys; the rest declare every key.
Requests are in ``protocol.py``; scoring mode's bodies in ``scoring/protocol.py``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .protocol import ResponseModel
from .scoring.protocol import ChatLogprobs, CompletionLogprobs, Usage


class EmbeddingData(ResponseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str = Field(description="Floats, or base64 of little-endian float32")


class EmbeddingUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(ResponseModel):
    object: Literal["list"]
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class TokenizeResponse(ResponseModel):
    count: int
    max_model_len: int | None = Field(description="The model's context window (null: not stated)")
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(ResponseModel):
    prompt: str


class Extensible(BaseModel):
    """A body plugins may add keys to (``millm_*`` fields, tool calls)."""

    model_config = ConfigDict(extra="allow")


class ErrorObject(Extensible):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(ResponseModel):
    """Every refusal, in OpenAI's shape; an error may carry more keys (a probe's ``mismatches``)."""

    error: ErrorObject


# --- chat completions ----------------------------------------------------------------


class ToolCallFunction(Extensible):
    name: str | None = None
    arguments: str | None = None


class ToolCall(Extensible):
    index: int | None = Field(default=None, description="Set in streamed deltas only")
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunction | None = None


class ChatCompletionMessage(Extensible):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None
    reasoning_content: str | None = Field(
        default=None, description="A model that thinks: its thinking block, split from content"
    )
    tool_calls: list[ToolCall] | None = None


class ChatCompletionChoice(Extensible):
    index: int
    message: ChatCompletionMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = Field(description='"stop", "length", "tool_calls", ...')
    millm_variant: Literal["steered", "unsteered"] | None = Field(
        default=None, description="With with_unsteered: which reply this choice is (absent without it)"
    )


class ChatCompletionResponse(Extensible):
    """``POST /v1/chat/completions``, not streamed."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatCompletionChoice]
    usage: Usage


class ChatCompletionDelta(Extensible):
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = Field(
        default=None, description="A model that thinks: its thinking block, split from content"
    )
    tool_calls: list[ToolCall] | None = None


class ChatCompletionChunkChoice(Extensible):
    index: int
    delta: ChatCompletionDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    millm_variant: Literal["steered", "unsteered"] | None = Field(
        default=None, description="With with_unsteered: which reply this choice is (absent without it)"
    )


class ChatCompletionChunk(Extensible):
    """One ``data:`` event of a streamed chat completion (the stream ends with ``data: [DONE]``)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChatCompletionChunkChoice]
    usage: Usage | None = Field(
        default=None,
        description="On the last chunk, with stream_options.include_usage; on every chunk (usage so far), with "
        "stream_options.continuous_usage_stats",
    )


# --- text completions ----------------------------------------------------------------


class EchoedLogprobs(ResponseModel):
    """A completion's ``logprobs`` with ``echo``: the prompt's tokens first, then the generated ones."""

    tokens: list[str]
    token_logprobs: list[float | None] = Field(description="null for the prompt's first token")
    top_logprobs: list[dict[str, float] | None] = Field(description="null for the prompt's first token")
    text_offset: list[int] = Field(description="Character offset of each token within prompt plus completion")


class PromptLogprob(ResponseModel):
    """One token of a ``prompt_logprobs`` entry (vLLM's shape)."""

    logprob: float
    rank: int = Field(description="1: the most probable token at that position")
    decoded_token: str


class CompletionChoice(Extensible):
    text: str = Field(description="With echo, the prompt and then the completion")
    index: int
    logprobs: CompletionLogprobs | EchoedLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = Field(
        default=None,
        description="With prompt_logprobs: per prompt token, null for the first, then it and its most probable "
        "alternatives by token id (in a stream, on the choice's first chunk)",
    )
    millm_variant: Literal["steered", "unsteered"] | None = Field(
        default=None, description="With with_unsteered: which reply this choice is (absent without it)"
    )


class CompletionResponse(Extensible):
    """``POST /v1/completions``, not streamed."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage


class CompletionChunk(Extensible):
    """One ``data:`` event of a streamed text completion (the stream ends with ``data: [DONE]``)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None = Field(
        default=None,
        description="On the last chunk, with stream_options.include_usage; on every chunk (usage so far), with "
        "stream_options.continuous_usage_stats",
    )


# --- models --------------------------------------------------------------------------


class Model(ResponseModel):
    """``GET /v1/models/{model_id}``."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    parent: str | None = Field(default=None, description="A LoRA adapter's base model (vLLM's field)")
    root: str | None = Field(default=None, description="A LoRA adapter's directory (vLLM's field)")


class ModelList(ResponseModel):
    """``GET /v1/models``."""

    object: Literal["list"]
    data: list[Model]


class ModelDetail(Extensible):
    """``GET /api/models/{model_id}``: state, and the loaded weights' identity while resident."""

    id: str
    state: str
    engine: str
    format: str | None = None
    path: str | None = None
    quantization: str | None = None
    hf_id: str | None = None
    revision: str | None = None
    error: str | None = None


class ModelDetailList(ResponseModel):
    """``GET /api/models``."""

    data: list[ModelDetail]


class AdapterDetail(ResponseModel):
    """A LoRA adapter served on a model (``/api/models/{model_id}/adapters``)."""

    id: str = Field(description="What a request's model names it: <base>:<name>")
    name: str
    base: str
    path: str


class AdapterList(ResponseModel):
    """``GET /api/models/{model_id}/adapters``."""

    data: list[AdapterDetail]


# --- health --------------------------------------------------------------------------


class PluginLoaded(ResponseModel):
    name: str
    version: str | None


class PluginFailed(ResponseModel):
    name: str
    error: str | None


class QueueState(ResponseModel):
    admitted: int
    max_waiting: int
    generating: bool
    stalled: bool
    shutting_down: bool


class ConvergerState(ResponseModel):
    """One plugin's convergence on this replica."""

    converged: bool
    reasons: list[str]


class ReplicaState(ResponseModel):
    """This replica's convergence to the desired state in the shared database."""

    id: str = Field(description="MILLM_REPLICA_ID, or host:port:pid")
    converged: bool
    reasons: list[str] = Field(description="Why this replica differs from the desired state, one line each")
    checked_at: float | None
    interval_s: float
    convergers: dict[str, ConvergerState] = Field(
        description="Each plugin's part of the desired state (probes, rulesets, steering), converged here or why not"
    )


class Health(ResponseModel):
    """``GET /api/health``."""

    status: Literal["ok", "loading", "unloading", "measuring", "degraded", "shutting_down", "failed", "no_model"] = (
        Field(
            description="ok: generation routes serve the resident model. loading, unloading, shutting_down, "
            "degraded (the engine failed or is restarting, or a generation stalled), failed and no_model: "
            "they refuse or cannot answer. measuring: admin work on the model runs (they refuse only if "
            "its reason says so). Every status but ok comes with a reason."
        )
    )
    reason: str | None = Field(default=None, description="Why the status is not ok, and what requests get meanwhile")
    model: str | None = Field(description="The resident model, the one loading, or the start model that failed")
    engine: str | None
    phase: str | None
    progress: str | None
    error: str | None
    engine_status: dict[str, Any] | None
    engines: list[str]
    plugins: list[PluginLoaded]
    failed_plugins: list[PluginFailed]
    queue: QueueState
    replica: ReplicaState
