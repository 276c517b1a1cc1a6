"""A parsed body validated against a request model, the first error naming its parameter, in slices.

pydantic-core holds the GIL for a whole call: a long chat, a long list of token ids
or many content parts are validated a slice at a time so the event loop runs between.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from ..errors import InvalidParameter
from ..protocol import ChatMessage, CompletionRequest, ContentPart, DetokenizeRequest, EmbeddingRequest, TokenId
from . import collector, release
from .read import held_apart


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
        with collector.paused():  # a long chat builds a model a message: collector passes would hold the GIL
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
    release.keep_if_long(done)
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
    held_apart(done, plain=True)
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
    release.keep_if_long(done)
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
