"""Published JSON schemas, generated from the server's own protocol models.

``docs/schemas/millm-scoring-api-v1.json`` is this module's output; regenerate it with
``python -m millm_host.schemas`` (a test fails while the committed file is stale).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from .scoring.protocol import (
    ErrorResponse,
    ScoringChatRequest,
    ScoringChatResponse,
    ScoringCompletionRequest,
    ScoringCompletionResponse,
)

SCORING_SCHEMA_PATH = Path("docs") / "schemas" / "millm-scoring-api-v1.json"

_REQUESTS: dict[str, type[BaseModel]] = {
    "/v1/completions": ScoringCompletionRequest,
    "/v1/chat/completions": ScoringChatRequest,
}
_RESPONSES: dict[str, type[BaseModel]] = {
    "/v1/completions": ScoringCompletionResponse,
    "/v1/chat/completions": ScoringChatResponse,
}


def scoring_api_schema() -> dict[str, Any]:
    """The scoring API: request and response of each endpoint, and the refusal."""
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [(m, "validation") for m in _REQUESTS.values()]
    responses: list[type[BaseModel]] = [*_RESPONSES.values(), ErrorResponse]
    models += [(m, "serialization") for m in responses]
    refs, defs = models_json_schema(models, ref_template="#/$defs/{model}")

    def ref(model: type[BaseModel], mode: JsonSchemaMode) -> dict[str, str]:
        return refs[(model, mode)]

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "millm-scoring-api-v1",
        "title": "millm scoring API, version 1",
        "description": (
            "Next-token scoring on /v1/completions (logprobs or allowed_token_ids with max_tokens 1) and "
            "chat scoring on /v1/chat/completions. Refusals use the error shape; scoring_precision "
            "float32 that can't be served is 409 scoring_precision_unavailable with the reason "
            "(model_not_float32_castable, memory, device, busy) in the message and in "
            "X-miLLM-Scoring-Precision-Reason."
        ),
        "endpoints": {
            path: {"request": ref(_REQUESTS[path], "validation"), "response": ref(_RESPONSES[path], "serialization")}
            for path in _REQUESTS
        },
        "refusal": ref(ErrorResponse, "serialization"),
        "$defs": defs["$defs"],
    }


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> None:
    """Write the scoring schema (to ``argv[0]``, default the repository's docs path)."""
    target = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / SCORING_SCHEMA_PATH
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render(scoring_api_schema()))
    print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv[1:])
