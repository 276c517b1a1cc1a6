"""The server's own OpenAPI document: every route added to the app, described by its responders.

Every route the host or a plugin adds is recorded (``RouteTable``); the document
walks them, so a route is never missing from it. What a responder takes and
answers comes from the ``Operation`` attached to it with ``@operation(...)``
(or that its resource's ``describe_operation(method, suffix)`` returns): the
pydantic models that validate the request and build the response, the query
parameters, and the statuses it can refuse with. Plugins' request fields on the
OpenAI endpoints (``register_request_schemas``) are merged into those
endpoints' request schemas.

Written by hand on pydantic's ``models_json_schema`` rather than with spectree:
spectree describes only what its own validation decorator wraps (422 errors in
its shape, models named with a hash), wants one module-level instance, and
cannot say "JSON, or server-sent events of these chunks"; the host validates
requests itself and keeps an app (and its plugins) per host.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import falcon
from falcon.routing import map_http_methods
from pydantic import BaseModel, create_model
from pydantic.json_schema import models_json_schema

from .response_bodies import ErrorResponse

F = TypeVar("F", bound=Callable[..., Any])

#: What each status means, for the document's descriptions.
STATUS_TEXT = {
    200: "the response",
    201: "created",
    400: "invalid request (also a Host this server does not answer to)",
    401: "missing or wrong API key",
    403: "a cross-origin request from a browser",
    404: "not found",
    409: "conflict with the current state",
    413: "body too large",
    415: "body not JSON",
    500: "server error",
    503: "busy, not loaded or shutting down",
}
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class Param:
    """A query parameter: its name, JSON schema and meaning."""

    name: str
    schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "string"})
    description: str = ""


@dataclass(frozen=True)
class Operation:
    """What one responder takes and answers.

    ``request``: the models a JSON body may match (several: ``anyOf``); ``None``
    for no body. ``response``: the models of a success body (``None``: a JSON
    object not modelled yet). ``stream``: the model of each server-sent event
    when the request asks to stream. ``errors``: the statuses this route refuses
    with besides those every route can (400, 500, and 401/403/413/415 where the
    access checks and body reading apply). ``endpoint``: the OpenAI endpoint
    (``"chat.completions"``) whose plugin fields join the first request model.
    """

    summary: str = ""
    request: Sequence[type[BaseModel]] | None = None
    request_required: bool = True
    response: Sequence[type[BaseModel]] | None = None
    stream: type[BaseModel] | None = None
    status: int = 200
    errors: Sequence[int] = ()
    query: Sequence[Param] = ()
    endpoint: str | None = None
    operation_id: str | None = None
    #: The success body's media type; anything but JSON is described as a string.
    media_type: str = "application/json"
    #: A ``multipart/form-data`` body instead of JSON (``POST /v1/files``).
    form: type[BaseModel] | None = None
    #: The model of every refusal (None: OpenAI's ``ErrorResponse``; ``/v1/messages`` answers Anthropic's shape).
    error: type[BaseModel] | None = None
    #: Whether a stream ends with ``data: [DONE]`` (OpenAI's chunks do; named events do not).
    stream_done: bool = True


def operation(
    summary: str = "",
    *,
    request: type[BaseModel] | Sequence[type[BaseModel]] | None = None,
    request_required: bool = True,
    response: type[BaseModel] | Sequence[type[BaseModel]] | None = None,
    status: int = 200,
    errors: Sequence[int] = (),
    query: Sequence[Param] = (),
    media_type: str = "application/json",
    form: type[BaseModel] | None = None,
) -> Callable[[F], F]:
    """Describe a responder (``on_get``, ``on_post_load``, ...) in ``/openapi.json``."""
    described = Operation(
        summary=summary,
        request=_models(request),
        request_required=request_required,
        response=_models(response),
        status=status,
        errors=tuple(errors),
        query=tuple(query),
        media_type=media_type,
        form=form,
    )

    def mark(responder: F) -> F:
        responder.__openapi__ = described  # type: ignore[attr-defined]
        return responder

    return mark


def _models(value: type[BaseModel] | Sequence[type[BaseModel]] | None) -> tuple[type[BaseModel], ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, type) else tuple(value)


@dataclass(frozen=True)
class Route:
    template: str
    resource: Any
    suffix: str | None


class RouteTable:
    """``add_route`` as the app's routes are installed: adds each to Falcon and remembers it."""

    def __init__(self, app: falcon.asgi.App) -> None:
        self.app = app
        self.routes: list[Route] = []

    def add_route(self, uri_template: str, resource: Any, **kwargs: Any) -> None:
        self.app.add_route(uri_template, resource, **kwargs)
        self.routes.append(Route(uri_template, resource, kwargs.get("suffix")))

    def methods(self, route: Route) -> list[str]:
        """The HTTP methods ``route``'s resource answers (Falcon's own default responders aside).

        A WebSocket responder (``on_websocket``) is left out: OpenAPI 3.1 has no way to describe one.
        """
        return sorted(m for m in map_http_methods(route.resource, suffix=route.suffix) if m != "WEBSOCKET")


def describe(route: Route, method: str) -> Operation:
    """The responder's ``Operation``, or an undescribed one (the route is listed all the same)."""
    describe_operation = getattr(route.resource, "describe_operation", None)
    if describe_operation is not None:
        found = describe_operation(method, route.suffix)
        if found is not None:
            return found
    name = f"on_{method.lower()}" + (f"_{route.suffix}" if route.suffix else "")
    return getattr(getattr(route.resource, name), "__openapi__", None) or Operation()


@dataclass
class DocumentInputs:
    """What the document is built from, besides the routes."""

    #: endpoint ("chat.completions") → plugin models whose fields that endpoint also takes
    request_fields: Mapping[str, Sequence[type[BaseModel]]] = field(default_factory=dict)
    #: (path, model) request bodies plugins listed in ``host.openapi_bodies`` (older mechanism)
    bodies: Sequence[tuple[str, type[BaseModel]]] = ()
    #: Whether a path is behind an API key (401 possible)
    guarded: Callable[[str], bool] = lambda path: False


def openapi_document(routes: Iterable[tuple[Route, str]], inputs: DocumentInputs) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``(route, method)`` pairs."""
    operations = [
        (route, method, _with_bodies(describe(route, method), route, method, inputs)) for route, method in routes
    ]
    merged = _merged_requests(operations, inputs.request_fields)
    models: list[type[BaseModel]] = [ErrorResponse]
    for _, _, op in operations:
        for model in (
            *(op.request or ()),
            *(op.response or ()),
            *((op.stream,) if op.stream else ()),
            *((op.form,) if op.form else ()),
            *((op.error,) if op.error else ()),
        ):
            model = merged.get(model, model) if op.request and model in op.request else model
            if model not in models:
                models.append(model)
    refs, schemas = models_json_schema([(m, "validation") for m in models], ref_template="#/components/schemas/{model}")

    def ref(model: type[BaseModel]) -> dict[str, Any]:
        return refs[(model, "validation")]

    def one_of(models: Sequence[type[BaseModel]]) -> dict[str, Any]:
        return ref(models[0]) if len(models) == 1 else {"anyOf": [ref(m) for m in models]}

    paths: dict[str, Any] = {}
    for route, method, op in operations:
        entry: dict[str, Any] = {"operationId": op.operation_id or _operation_id(method, route.template)}
        if op.summary:
            entry["summary"] = op.summary
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", route.template)
        ]
        parameters += [
            {"name": p.name, "in": "query", "required": False, "schema": dict(p.schema), "description": p.description}
            for p in op.query
        ]
        if parameters:
            entry["parameters"] = parameters
        if op.request:
            requests = [merged.get(m, m) for m in op.request]
            entry["requestBody"] = {
                "required": op.request_required,
                "content": {"application/json": {"schema": one_of(requests)}},
            }
        if op.form is not None:
            entry["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": ref(op.form)}}}
        success: dict[str, Any] = {"description": STATUS_TEXT.get(op.status, "the response")}
        if op.media_type == "application/octet-stream":  # bytes as stored: a JSONL file is no JSON document
            content: dict[str, Any] = {op.media_type: {"schema": {"type": "string", "format": "binary"}}}
        elif op.media_type != "application/json":
            content = {op.media_type: {"schema": {"type": "string"}}}
        else:
            content = {"application/json": {"schema": one_of(op.response) if op.response else {"type": "object"}}}
        if op.stream is not None:
            content["text/event-stream"] = {
                "schema": {
                    **ref(op.stream),
                    "description": f"With stream: true, server-sent events: each data: line is one "
                    f"{op.stream.__name__}" + (", then data: [DONE]" if op.stream_done else ""),
                }
            }
        success["content"] = content
        errors = _error_responses(route.template, method, op, inputs, ref(op.error or ErrorResponse))
        entry["responses"] = {str(op.status): success, **errors}
        paths.setdefault(route.template, {})[method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": "millm", "version": "1"},
        "paths": dict(sorted(paths.items())),
        "components": {"schemas": schemas.get("$defs", {})},
    }


def _with_bodies(op: Operation, route: Route, method: str, inputs: DocumentInputs) -> Operation:
    """A POST route with no request described takes the models ``host.openapi_bodies`` lists for it."""
    if op.request is None and method == "POST":
        listed = tuple(model for path, model in inputs.bodies if path == route.template)
        if listed:
            return replace(op, request=listed)
    return op


def _merged_requests(
    operations: Sequence[tuple[Route, str, Operation]], request_fields: Mapping[str, Sequence[type[BaseModel]]]
) -> dict[type[BaseModel], type[BaseModel]]:
    """Each endpoint's first request model, with the fields plugins add to that endpoint (same name)."""
    merged: dict[type[BaseModel], type[BaseModel]] = {}
    for _, _, op in operations:
        extras = tuple(request_fields.get(op.endpoint or "", ()))
        if op.request and extras and op.request[0] not in merged:
            base = op.request[0]
            merged[base] = create_model(base.__name__, __base__=(*reversed(extras), base), __doc__=base.__doc__)
    return merged


def _error_responses(
    path: str, method: str, op: Operation, inputs: DocumentInputs, error: dict[str, Any]
) -> dict[str, Any]:
    statuses = {400, 500, *op.errors}
    if inputs.guarded(path):
        statuses.add(401)
    if method in STATE_CHANGING:
        statuses |= {403, 415}  # the access checks: a browser's cross-origin request, a body that is not JSON
        if op.request or op.form:
            statuses.add(413)
    body = {"content": {"application/json": {"schema": error}}}
    return {str(s): {"description": STATUS_TEXT.get(s, "refused"), **body} for s in sorted(statuses)}


def _operation_id(method: str, template: str) -> str:
    """``POST /v1/chat/completions`` → ``post_v1_chat_completions``."""
    return "_".join([method.lower(), *re.findall(r"\w+", template)])
