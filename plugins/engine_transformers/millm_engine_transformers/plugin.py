"""Hook implementations of the transformers engine plugin."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from millm_host.api import hookimpl

from .spec import ENGINE_NAME, SPEC

# Scoring mode (next-token log-probabilities); scoring_precision is served on completions only.
COMPLETION_SCORING_FIELDS = ("logprobs", "allowed_token_ids", "return_tokens_as_token_ids", "scoring_precision")
CHAT_SCORING_FIELDS = ("logprobs", "top_logprobs", "allowed_token_ids", "return_tokens_as_token_ids")
#: vLLM's names: the sampler masks the end-of-sequence ids (``sampling.Penalties``).
EOS_FIELDS = ("ignore_eos", "min_tokens")


@hookimpl
def register_engines(register) -> None:
    register(SPEC)


@hookimpl
def register_request_fields(register) -> None:
    engines = [ENGINE_NAME]
    register(
        "chat.completions", ("seed", "n", "chat_template_kwargs", *CHAT_SCORING_FIELDS, *EOS_FIELDS), engines=engines
    )
    register("completions", ("seed", "n", *COMPLETION_SCORING_FIELDS, *EOS_FIELDS), engines=engines)
    register("embeddings", ("pooling",), engines=engines)


class ChatTemplateFields(BaseModel):
    chat_template_kwargs: dict[str, Any] | None = Field(
        default=None, description="Extra variables for the model's chat template (transformers engine)"
    )


@hookimpl
def register_request_schemas(register) -> None:
    """``chat_template_kwargs``, in the chat completion request schema of ``/openapi.json``."""
    register("chat.completions", ChatTemplateFields)
