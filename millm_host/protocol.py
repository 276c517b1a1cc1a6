"""Request and response models of the OpenAI-compatible endpoints (protocol only, no serving).

Scoring mode's models live beside its serving (``millm_host.scoring.protocol``).

Validation is strict: a string where a number belongs, ``true`` for a seed or an
out-of-range value is a ``400 invalid_parameter`` naming the parameter. Fields
the host does not read are allowed through (``extra="allow"``) so the field
registry can report or refuse them; plugins validate their own fields.
"""

from __future__ import annotations

import codecs
import json
import math
import re
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator, model_validator

from . import gcpause, graveyard
from .errors import InvalidParameter, MillmError
from .jsonslices import SLICE, TooDeep, TooManyContainers, loads_in_slices

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


# --- responses: built from these models, so what is sent is what is published ------------


class ResponseModel(BaseModel):
    """Base of a response model: every field declared."""

    model_config = ConfigDict(extra="forbid")


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


# --- body parsing ----------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise InvalidParameter(f"{name} is not valid JSON; numbers must be finite", param=None)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidParameter(f"number {text[:40]} is out of range", param=None)
    return value


MAX_JSON_INTEGER = 2**63


def _bounded_int(text: str) -> int:
    """Integers past 64 bits mean nothing to any field; refusing them here spares every reader."""
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) > MAX_JSON_INTEGER:
        raise InvalidParameter(f"integer {text[:40]}{'…' if len(text) > 40 else ''} is out of range", param=None)
    return value


class BodyRefused(InvalidParameter):
    """A body refused while it was parsed (nesting or containers past their bound).

    What it still says of itself (a batch line's ``custom_id``): ``jsonslices.top_level_strings``.
    """


def parse_json_body(raw: bytes, max_depth: int, max_containers: int | None = None) -> dict[str, Any]:
    """Parse a request body: UTF-8 JSON object, finite numbers, bounded nesting and containers, valid Unicode.

    Linear in the body, and in slices (``jsonslices``): no one C call decodes,
    scans or searches more than a slice, so a worker thread parsing 4 MiB lets
    the event loop run every few ms. The nesting, and the number of objects and
    arrays (``max_containers``, None: unbounded), are bounded while parsing. A
    ``\\uD800``-style escape without its pair decodes to a lone surrogate, which no
    tokenizer, database or header can take: it is refused here, naming where it
    is. Call it off the event loop for large bodies (``resources.common.parse_json``).
    """
    text = _decoded(raw)
    refusal: str | None = None
    try:
        with gcpause.paused():
            body = loads_in_slices(
                text, _BODY_DECODER, max_depth, max_containers, _SHORT_INTS_DECODER, long_list=_held_apart
            )
    except json.JSONDecodeError as exc:
        refusal = f"the request body is not valid JSON: {exc.msg} (character {exc.pos})"
    except (TooDeep, RecursionError):
        refusal = f"the request body nests deeper than {max_depth} levels"
    except TooManyContainers:
        refusal = (
            f"the request body holds more than {max_containers} JSON objects and arrays (MILLM_MAX_JSON_CONTAINERS)"
        )
    if refusal is not None:
        # Raised here, not in the handler: the parser's exception (its traceback's frames hold the text and
        # what was parsed of it) is gone by now, freed on this thread, not kept alive by the 400 as its context.
        raise BodyRefused(refusal)
    if not isinstance(body, dict):
        raise InvalidParameter("the request body must be a JSON object")
    if _has_surrogate_escape(raw):
        where = lone_surrogate_at(body)
        if where is not None:
            raise InvalidParameter(
                f"{where} holds a lone surrogate (a \\uD800-\\uDFFF escape without its pair); "
                "text must be valid Unicode",
                param=where,
            )
    return body


def _held_apart(items: list[Any], plain: bool) -> None:
    """A long parsed list: out of the collector's sight when it holds only scalars, and freed by the graveyard."""
    if plain:
        gcpause.untrack_plain(items)
    graveyard.keep(items)


_BODY_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_bounded_int)
#: The same, for text with no integer of 19 digits or more: none is out of range (``_bounded_int``).
_SHORT_INTS_DECODER = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
#: Bytes one C call decodes or searches (a slice of ``jsonslices``' size, for 4-byte characters).
_BYTES_SLICE = 4 * SLICE


def _decoded(raw: bytes) -> str:
    """``raw`` as UTF-8, a slice at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    parts = []
    for start in range(0, len(raw) + 1, _BYTES_SLICE):
        pending = len(decoder.getstate()[0])  # bytes of a character the last slice cut
        try:
            parts.append(decoder.decode(raw[start : start + _BYTES_SLICE], final=start + _BYTES_SLICE > len(raw)))
        except UnicodeDecodeError as exc:
            raise InvalidParameter(
                f"the request body is not valid UTF-8 (byte {start - pending + exc.start})"
            ) from None
    return "".join(parts)


def _has_surrogate_escape(raw: bytes) -> bool:
    """Whether ``raw`` holds a \\uD800-\\uDFFF escape, searched a slice at a time (slices overlap by 5 bytes)."""
    return any(
        _SURROGATE_ESCAPE.search(raw, start, start + _BYTES_SLICE + 5) is not None
        for start in range(0, len(raw), _BYTES_SLICE)
    )


#: Every lone surrogate comes from such an escape (raw UTF-8 cannot hold one): bodies without it skip the walk.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def lone_surrogate_at(value: Any) -> str | None:
    """Where the first string (or key) holding a lone surrogate is (``messages[0].content``); None if none."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, str):
            if not _encodable(node):
                return where or "body"
        elif isinstance(node, dict):
            for key, child in reversed(node.items()):
                if not _encodable(key):
                    return f"a key of {where or 'the body'}"
                stack.append((f"{where}.{key}" if where else key, child))
        elif isinstance(node, list):
            stack.extend((f"{where}[{i}]", child) for i, child in reversed(list(enumerate(node))))
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def refuse_long_chat(body: dict[str, Any], limit: int, parts_limit: int | None = None) -> None:
    """A 400 for more than ``limit`` messages (over ``messages`` and every ``extra_messages``
    conversation), or content parts in one message, or ``parts_limit`` content parts in all
    (``MILLM_MAX_CONTENT_PARTS``), before any is built."""
    seen = parts = 0
    for name, messages in _conversations(body):
        seen += len(messages)
        if seen > limit:
            raise InvalidParameter(
                f"{name}: at most {limit} messages in all, counted over messages and extra_messages "
                "(MILLM_MAX_MESSAGES)",
                param=name,
            )
        for i, message in enumerate(messages):
            if not (isinstance(message, dict) and isinstance(message.get("content"), list)):
                continue
            where = f"{name}[{i}].content"
            if len(message["content"]) > limit:
                raise InvalidParameter(f"{where}: at most {limit} content parts (MILLM_MAX_MESSAGES)", param=where)
            parts += len(message["content"])
            if parts_limit is not None and parts > parts_limit:
                raise InvalidParameter(
                    f"{where}: the chat holds more than {parts_limit} content parts in all, counted up to this "
                    "message (MILLM_MAX_CONTENT_PARTS)",
                    param=where,
                )


def _conversations(body: dict[str, Any]) -> Iterator[tuple[str, list[Any]]]:
    """``messages`` and each conversation of ``extra_messages`` that is a list, with its parameter name."""
    if isinstance(body.get("messages"), list):
        yield "messages", body["messages"]
    extra = body.get("extra_messages")
    for index, messages in enumerate(extra if isinstance(extra, list) else ()):
        if isinstance(messages, list):
            yield f"extra_messages[{index}]", messages


def validate(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """Validate ``body`` against ``model``; the first error names its parameter."""
    try:
        with gcpause.paused():  # a long chat builds a model a message: collector passes would hold the GIL
            body = _messages_validated_in_slices(model, body)
            name, items = _long_list_validated_in_slices(model, body)
            if name is None:
                return model.model_validate(body)
            # the model sees the list's first item (which picks its union member); the rest is validated
            first = [items[0][:1]] if isinstance(items[0], list) else items[:1]
            params = model.model_validate({**body, name: first})
    except ValidationError as exc:
        raise _invalid(exc) from None
    setattr(params, name, items)
    return params


def _invalid(exc: ValidationError, offset: tuple[Any, ...] = ()) -> InvalidParameter:
    """The first error of ``exc`` as a 400 naming its parameter (``offset``: where the validated part sits)."""
    err = exc.errors()[0]
    return _named(err["type"], err["msg"], loc_to_param(offset + tuple(err["loc"])))


def _named(kind: str, message: str, param: str) -> InvalidParameter:
    if kind == "missing":
        return InvalidParameter(f"{param} is required", param=param)
    return InvalidParameter(f"{param}: {message}", param=param)


#: Items pydantic validates in one call. pydantic-core holds the GIL for a whole call,
#: so a 4 MiB chat of 150,000 tiny messages validated at once stalled the event loop
#: (its worker thread's) for half a second; in slices the loop runs between them.
VALIDATION_SLICE = 1024
_messages_adapter = TypeAdapter(list[ChatMessage])
_parts_adapter = TypeAdapter(list[ContentPart])


def _messages_validated_in_slices(model: type[BaseModel], body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with a long ``messages`` list already validated, slice by slice (messages and content parts)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or "messages" not in model.model_fields:
        return body
    weight = len(messages) + sum(len(m["content"]) for m in messages if isinstance(m, dict) and _has_parts(m))
    if weight <= VALIDATION_SLICE:
        return body
    done: list[ChatMessage] = []
    start = 0
    while start < len(messages):
        end, budget = start, 0
        while end < len(messages) and (end == start or budget < VALIDATION_SLICE):
            message = messages[end]
            budget += 1 + (len(message["content"]) if isinstance(message, dict) and _has_parts(message) else 0)
            end += 1
        if end - start == 1 and budget > VALIDATION_SLICE:  # one message of many parts: its parts in slices
            done.append(_message_with_many_parts(messages[start], start))
        else:
            done.extend(_validated_slice(_messages_adapter, messages, start, end, ("messages",)))
        start = end
        time.sleep(0)  # hand the GIL to the event loop between slices
    graveyard.keep_if_long(done)
    return {**body, "messages": done}


#: The list field of each request whose items are strings, token ids or token-id lists, by the million
#: in a 4 MiB body (2M token ids held the GIL 0.3 s in one pydantic-core call on a loaded 2-core
#: machine): validated in slices.
_SLICED_LISTS: dict[type[BaseModel], str] = {
    EmbeddingRequest: "input",
    CompletionRequest: "prompt",
    DetokenizeRequest: "tokens",
}
_strings_adapter = TypeAdapter(list[str])
_ids_adapter = TypeAdapter(list[TokenId])
_id_lists_adapter = TypeAdapter(list[list[TokenId]])


def _long_list_validated_in_slices(model: type[BaseModel], body: dict[str, Any]) -> tuple[str | None, list[Any]]:
    """(the field, its items validated slice by slice) for ``model``'s long list of strings or token ids
    (or token-id lists); (None, []) when there is none. The slices are read as the list's first item is."""
    name = next((field for kind, field in _SLICED_LISTS.items() if issubclass(model, kind)), None)
    items = body.get(name) if name is not None else None
    if not isinstance(items, list) or not items or not isinstance(items[0], (str, int, list)):
        return None, []
    if isinstance(items[0], list):
        if len(items) + sum(len(item) for item in items if isinstance(item, list)) <= VALIDATION_SLICE:
            return None, []
        return name, _id_lists_in_slices(items, (name,))
    if len(items) <= VALIDATION_SLICE:
        return None, []
    return name, _flat_in_slices(_strings_adapter if isinstance(items[0], str) else _ids_adapter, items, (name,))


def _flat_in_slices(adapter: TypeAdapter, items: list[Any], where: tuple[Any, ...]) -> list[Any]:
    """Strings or token ids validated a slice at a time; the result is held apart as a parsed list is.

    A slice of nothing but strings (or of ints, none negative) is what pydantic would return, as it is:
    two C calls see that (``_plainly``), where pydantic took 275 ns an id (550 ms for 2M on a loaded
    machine, the event loop waiting behind each slice). Any other slice goes to pydantic, for its error.
    """
    kind = str if adapter is _strings_adapter else int
    done: list[Any] = []
    for start in range(0, len(items), VALIDATION_SLICE):
        end = min(start + VALIDATION_SLICE, len(items))
        chunk = items[start:end]
        done.extend(chunk if _plainly(kind, chunk) else _validated_slice(adapter, items, start, end, where))
        # hand the GIL to the event loop between slices: waiting to be made to (the switch interval) cost
        # 2M token ids' slowest health answer 18.6-19.8 ms against 11.5-12.3 ms (bench, runs 9, load 1.4)
        time.sleep(0)
    _held_apart(done, plain=True)
    return done


def _plainly(kind: type, chunk: list[Any]) -> bool:
    """Whether strict validation as ``list[str]`` (``kind`` str) or ``list[TokenId]`` (int) keeps ``chunk`` as it is."""
    return set(map(type, chunk)) == {kind} and (kind is str or min(chunk) >= 0)


def _id_lists_in_slices(items: list[Any], where: tuple[Any, ...]) -> list[Any]:
    """Token-id lists, a slice of about ``VALIDATION_SLICE`` ids at a time (a long one in slices of its own)."""
    done: list[Any] = []
    start = 0
    while start < len(items):
        end, budget = start, 0
        while end < len(items) and (end == start or budget < VALIDATION_SLICE):
            budget += 1 + (len(items[end]) if isinstance(items[end], list) else 0)
            end += 1
        if end - start == 1 and budget > VALIDATION_SLICE:
            done.append(_flat_in_slices(_ids_adapter, items[start], (*where, start)))
        else:
            done.extend(_validated_slice(_id_lists_adapter, items, start, end, where))
        start = end
        time.sleep(0)
    graveyard.keep_if_long(done)
    return done


def _has_parts(message: dict[str, Any]) -> bool:
    return isinstance(message.get("content"), list)


def _validated_slice(adapter: TypeAdapter, items: list[Any], start: int, end: int, where: tuple[Any, ...]) -> list[Any]:
    """``items[start:end]`` validated; an error names the item by its index in the whole list."""
    try:
        return adapter.validate_python(items[start:end], strict=True)
    except ValidationError as exc:
        loc = tuple(exc.errors()[0]["loc"])
        shifted = (loc[0] + start, *loc[1:]) if loc and isinstance(loc[0], int) else loc
        error = exc.errors()[0]
        raise _named(error["type"], error["msg"], loc_to_param(where + shifted)) from None


def _message_with_many_parts(message: dict[str, Any], index: int) -> ChatMessage:
    """One message whose content parts are validated slice by slice, then the message around them."""
    parts = message["content"]
    validated: list[ContentPart] = []
    for start in range(0, len(parts), VALIDATION_SLICE):
        end = min(start + VALIDATION_SLICE, len(parts))
        validated.extend(_validated_slice(_parts_adapter, parts, start, end, ("messages", index, "content")))
        time.sleep(0)
    try:
        return ChatMessage.model_validate({**message, "content": validated}, strict=True)
    except ValidationError as exc:
        raise _invalid(exc, ("messages", index)) from None


def loc_to_param(loc: tuple[Any, ...]) -> str:
    """``("messages", 2, "content")`` → ``"messages[2].content"`` (type tags dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and _is_union_tag(part):
            continue  # pydantic's union-member tags
        else:
            out += f".{part}" if out else part
    return out or "body"


#: pydantic's tags for a union member that is a bare scalar; the others carry brackets ("list[str]").
_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "bytes", "none"})


def _is_union_tag(part: str) -> bool:
    """A union-member tag, not a field name: "stream" and "integer_field" are field names."""
    return part in _SCALAR_TAGS or "[" in part or part.startswith(("constrained-", "function-"))
