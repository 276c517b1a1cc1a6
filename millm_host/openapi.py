"""The server's own OpenAPI document, generated from its protocol models."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from .scoring.protocol import ScoringChatRequest, ScoringCompletionRequest

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

#: (path, model) of every JSON request body; plugins add theirs to ``extra_bodies``.
#: A path listed with several models accepts any of them (``anyOf``).
REQUEST_BODIES: list[tuple[str, type[BaseModel]]] = [
    ("/v1/chat/completions", ChatCompletionRequest),
    ("/v1/chat/completions", ScoringChatRequest),
    ("/v1/completions", CompletionRequest),
    ("/v1/completions", ScoringCompletionRequest),
    ("/v1/embeddings", EmbeddingRequest),
]


def _error_responses() -> dict[str, Any]:
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
    return {
        str(code): {"description": desc, **ref}
        for code, desc in (
            (400, "invalid request"),
            (404, "not found"),
            (409, "conflict"),
            (413, "body too large"),
            (415, "not JSON"),
            (500, "server error"),
            (503, "busy or not loaded"),
        )
    }


def openapi_document(extra_bodies: Sequence[tuple[str, type[BaseModel]]] = ()) -> dict[str, Any]:
    bodies = [*REQUEST_BODIES, *extra_bodies]
    _, schemas = models_json_schema([(m, "validation") for _, m in bodies], ref_template="#/components/schemas/{model}")
    components = dict(schemas.get("$defs", {}))
    components["ErrorResponse"] = ERROR_SCHEMA
    paths: dict[str, Any] = {}
    accepted: dict[str, list[dict[str, str]]] = {}
    for path, model in bodies:
        accepted.setdefault(path, []).append({"$ref": f"#/components/schemas/{model.__name__}"})
    for path, refs in accepted.items():
        paths[path] = {
            "post": {
                "operationId": path.strip("/").replace("/", "_"),
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}},
                },
                "responses": {
                    "200": {
                        "description": "the response",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    **_error_responses(),
                },
            }
        }
    paths["/v1/models"] = {"get": {"operationId": "list_models", "responses": {"200": {"description": "models"}}}}
    paths["/v1/models/{model_id}"] = {
        "get": {
            "operationId": "get_model",
            "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "a model"}, **_error_responses()},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "millm", "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }
