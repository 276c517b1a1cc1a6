"""The published scoring schema is current, and the server's answers obey it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from millm_host.schemas import SCORING_SCHEMA_PATH, render, scoring_api_schema

REPO = Path(__file__).resolve().parents[2]


def published() -> dict:
    return json.loads((REPO / SCORING_SCHEMA_PATH).read_text())


def test_the_committed_schema_is_current():
    assert (REPO / SCORING_SCHEMA_PATH).read_text() == render(scoring_api_schema()), (
        "docs/schemas/millm-scoring-api-v1.json is stale: run python -m millm_host.schemas"
    )


def validator(pointer: dict) -> jsonschema.Draft202012Validator:
    schema = {**published(), **pointer}
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_requests_and_answers_obey_the_published_schema(tiny_server):
    endpoints = published()["endpoints"]
    with tiny_server.http() as client:
        model = client.get("/api/health").json()["model"]
        requests = {
            "/v1/completions": {
                "model": model,
                "prompt": ["a", "b"],
                "max_tokens": 1,
                "logprobs": 2,
                "allowed_token_ids": [5, 6, 7],
                "scoring_precision": "native",
            },
            "/v1/chat/completions": {
                "model": model,
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1,
                "logprobs": True,
                "top_logprobs": 2,
            },
        }
        for path, body in requests.items():
            validator(endpoints[path]["request"]).validate(body)
            reply = client.post(path, json=body)
            assert reply.status_code == 200, reply.text
            validator(endpoints[path]["response"]).validate(reply.json())
        refusal = client.post("/v1/completions", json={**requests["/v1/completions"], "max_tokens": 2})
    assert refusal.status_code == 400
    validator(published()["refusal"]).validate(refusal.json())
    assert not validator(endpoints["/v1/completions"]["request"]).is_valid(
        {**requests["/v1/completions"], "logprobs": 21}
    )


def test_openapi_documents_scoring_fields_and_embeddings(tiny_server):
    with tiny_server.http() as client:
        document = client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    body = document["paths"]["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/EmbeddingRequest"}
    assert {"input", "encoding_format", "pooling", "normalize"} <= set(schemas["EmbeddingRequest"]["properties"])
    completion = schemas["ScoringCompletionRequest"]["properties"]
    assert {"logprobs", "allowed_token_ids", "return_tokens_as_token_ids", "scoring_precision"} <= set(completion)
    assert {"logprobs", "top_logprobs", "allowed_token_ids"} <= set(schemas["ScoringChatRequest"]["properties"])
