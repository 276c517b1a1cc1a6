"""Request models of the OpenAI-compatible endpoints (protocol only, no serving), and ``ResponseModel``.

Response bodies are in ``response_bodies.py`` (their base, ``ResponseModel``, is here: scoring
mode's bodies share it); scoring mode's models beside its serving
(``millm_host.scoring.protocol``); reading and validating a hostile body in slices in
``millm_host.bodies``.

Validation is strict: a string where a number belongs, ``true`` for a seed or an
out-of-range value is a ``400 invalid_parameter`` naming the parameter. Fields
the host does not read are allowed through (``extra="allow"``) so the field
registry can report or refuse them; plugins validate their own fields.
"""

from __future__ import annotations

from typing import Annotated, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import InvalidParameter, MillmError

MAX_SEED = 2**32 - 1

Temperature = Annotated[float, Field(ge=0, le=2, description="0 = greedy. Range 0-2")]
TopP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
PositiveInt = Annotated[int, Field(ge=1)]
TopLogprobs = Annotated[int, Field(ge=0, le=20)]
#: Most entries one ``logit_bias`` may hold.
MAX_LOGIT_BIAS = 1024
#: Request lists stop at their first bad item: a union member that does not fit
#: (4 MiB of token ids tried as strings) would otherwise build an error per item.
FAIL_FAST = Field(fail_fast=True)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class ContentPart(_Strict):
    type: str
    text: str | None = None


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | Annotated[list[ContentPart], FAIL_FAST] | None = None


class StreamOptions(_Strict):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = Field(
        default=None, description="vLLM's: every chunk carries usage so far (the last usage chunk needs include_usage)"
    )


class SamplingFields(_Strict):
    """Fields chat and text completions share."""

    model: str
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: PositiveInt | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    stop: str | Annotated[list[str], FAIL_FAST] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: Seed | None = None
    logit_bias: dict[str, float] | None = Field(
        default=None, description="Token id (as a string) -> bias added to its logit, -100 to 100"
    )
    ignore_eos: bool | None = Field(
        default=None, description="vLLM's: the end-of-sequence tokens are never drawn; generate until max_tokens"
    )
    min_tokens: Annotated[int, Field(ge=0)] | None = Field(
        default=None,
        description="vLLM's: no end-of-sequence token is drawn and no stop sequence ends the text before this "
        "many tokens",
    )
    with_unsteered: bool | None = Field(
        default=None,
        description="miLLM's: both replies in one request, as rows of one batch: choices 0..k-1 steered (as the "
        "request without this field), then k..2k-1 unsteered (as the request with steering off, features: []), "
        "k = prompts x n; each choice says which in millm_variant. Both are equal where nothing steers",
    )

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if not key.isdecimal() or not key.isascii():
                raise ValueError(f"key {key[:40]!r} is not a token id")
            if not -100 <= bias <= 100:
                raise ValueError(f"the bias of token {key} is {bias}; biases are -100 to 100")
        if value is not None and len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 16:
            raise ValueError("at most 16 stop sequences")
        return value

    @model_validator(mode="after")
    def _combinations(self) -> SamplingFields:
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise MillmError(
                f"max_tokens ({self.max_tokens}) and max_completion_tokens "
                f"({self.max_completion_tokens}) differ; send one of them",
                param="max_tokens, max_completion_tokens",
                code="invalid_parameter",
            )
        if self.stream and (self.n or 1) > 1:
            raise InvalidParameter("n > 1 cannot be streamed; send stream: false", param="n")
        if self.stream_options is not None and not self.stream:
            raise InvalidParameter("stream_options needs stream: true", param="stream_options")
        requested = self.requested_max_tokens
        if self.min_tokens is not None and requested is not None and self.min_tokens > requested:
            raise InvalidParameter(
                f"min_tokens ({self.min_tokens}) is more than max_tokens ({requested})", param="min_tokens"
            )
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    @property
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1), FAIL_FAST]
    logprobs: bool | None = Field(default=None, description="Return each generated token's log-probability")
    top_logprobs: TopLogprobs | None = Field(default=None, description="Most probable alternatives per token, 0-20")
    include_reasoning: bool | None = Field(
        default=None,
        description="For a model that thinks: false leaves the thinking block (message.reasoning_content) out",
    )


TokenId = Annotated[int, Field(ge=0)]
PromptIds = Annotated[list[TokenId], Field(min_length=1), FAIL_FAST]


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``."""

    prompt: (
        str
        | Annotated[list[str], Field(min_length=1), FAIL_FAST]
        | PromptIds
        | Annotated[list[PromptIds], Field(min_length=1), FAIL_FAST]
    )
    add_special_tokens: bool | None = True
    logprobs: TopLogprobs | Literal[False] | None = Field(
        default=None, description="Return each generated token's log-probability and this many alternatives, 0-20"
    )
    max_tokens: Annotated[int, Field(ge=0)] | None = Field(
        default=None, description="0 (with echo or prompt_logprobs): nothing is generated, only the prompt scored"
    )
    echo: bool | None = Field(
        default=None,
        description="The prompt before the completion: in text, and with logprobs in the logprobs too (the "
        "prompt's first token has a null logprob and null top_logprobs)",
    )
    prompt_logprobs: TopLogprobs | None = Field(
        default=None,
        description="vLLM's: each choice's prompt_logprobs lists, per prompt token, its logprob and rank and this "
        "many alternatives, 0-20 (the first token: null)",
    )

    @model_validator(mode="after")
    def _nothing_generated(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo and self.prompt_logprobs is None:
            raise InvalidParameter(
                "max_tokens 0 generates nothing: send it with echo or prompt_logprobs to score the prompt",
                param="max_tokens",
            )
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [cast("list[int]", list(p))]  # one prompt of token ids
        return cast("list[str | list[int]]", list(p))


class EmbeddingRequest(_Strict):
    """``POST /v1/embeddings``: one vector per input, pooled from the last hidden layer."""

    model: str
    input: (
        str
        | Annotated[list[str], FAIL_FAST]
        | Annotated[list[TokenId], FAIL_FAST]
        | Annotated[list[Annotated[list[TokenId], FAIL_FAST]], FAIL_FAST]
    ) = Field(
        description="A string, a list of strings, token ids or a list of token-id lists; none may be empty. "
        "Token ids are OpenAI's tiktoken ids (cl100k_base by default), or the model's own (as POST /tokenize "
        "gives them) when the server runs with MILLM_EMBEDDING_TOKEN_IDS=model"
    )
    encoding_format: Literal["float", "base64"] | None = Field(
        default=None, description='"float" (default) or "base64" (little-endian float32)'
    )
    pooling: Literal["mean", "last", "cls"] | None = Field(
        default=None, description="How the last hidden layer becomes one vector (default mean)"
    )
    normalize: bool | None = Field(default=None, description="L2-normalise each vector")


class TokenizeRequest(_Strict):
    """``POST /tokenize`` (vLLM's shape): a text prompt, or a chat rendered as chat completions render it."""

    model: str
    prompt: str | None = Field(default=None, description="Text, tokenized as /v1/completions tokenizes a prompt")
    add_special_tokens: bool | None = Field(default=True, description="For prompt: add the tokenizer's special tokens")
    messages: Annotated[list[ChatMessage], Field(min_length=1), FAIL_FAST] | None = Field(
        default=None, description="A chat, rendered and tokenized exactly as /v1/chat/completions does (one BOS)"
    )
    add_generation_prompt: bool | None = Field(
        default=True, description="Must be true: generation always ends the render with the assistant's turn"
    )
    return_token_strs: bool | None = Field(default=False, description="Also return each token's text")

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if self.prompt is None and self.messages is None:
            raise InvalidParameter("prompt or messages is required", param="prompt")
        if self.prompt is not None and self.messages is not None:
            raise InvalidParameter("send prompt or messages, not both", param="messages")
        if self.add_generation_prompt is False:
            raise InvalidParameter(
                "add_generation_prompt false is not served: /tokenize counts what generation sends, "
                "which always ends with the assistant's turn",
                param="add_generation_prompt",
            )
        return self


class DetokenizeRequest(_Strict):
    """``POST /detokenize`` (vLLM's shape): token ids back to text, special tokens kept."""

    model: str
    tokens: Annotated[list[TokenId], FAIL_FAST]


# --- the base of every response body (``response_bodies.py``, scoring mode's) ---------


class ResponseModel(BaseModel):
    """Base of a response model: every field declared."""

    model_config = ConfigDict(extra="forbid")


def message_text(message: ChatMessage, index: int) -> str | None:
    """A message's content as text; text parts are joined, other parts are refused."""
    content = message.content
    if content is None or isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            from .errors import FieldNotHonoured

            raise FieldNotHonoured(
                f"content parts of type {part.type!r} are not supported; only text",
                param=f"messages[{index}].content[{j}]",
            )
        texts.append(part.text)
    return "".join(texts)
