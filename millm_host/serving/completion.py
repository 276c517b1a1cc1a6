"""``POST /v1/completions``: ``ServingCompletion`` (scoring-mode bodies go to its ``ServingScoring``; the
prompt's own logprobs, ``echo`` and ``prompt_logprobs``: ``prompt_logprobs``)."""

from __future__ import annotations

from ..context import RequestContext
from ..errors import InvalidParameter
from ..protocol import CompletionRequest
from ..response_bodies import CompletionChunk, CompletionResponse
from . import prompt_logprobs
from .prompts import completion_prompts, refuse_out_of_vocabulary
from .run import ServingGeneration


class ServingCompletion(ServingGeneration):
    """Text completions: one or more prompts, as text or token ids."""

    endpoint = "completions"
    protocol = CompletionRequest
    response_model = CompletionResponse
    chunk_model = CompletionChunk

    def read(self, ctx: RequestContext) -> None:
        super().read(ctx)
        most = self.host.settings["MILLM_MAX_PROMPTS"]
        if len(ctx.params.prompts) > most:
            raise InvalidParameter(f"at most {most} prompts per request", param="prompt")
        ctx.plan = prompt_logprobs.read(ctx)  # echo, prompt_logprobs

    def prompt_texts(self, ctx: RequestContext) -> list[list[str]]:
        return [[p] for p in ctx.params.prompts if isinstance(p, str)]

    def tokenize(self, ctx: RequestContext) -> None:
        ctx.prompts = completion_prompts(ctx)
        refuse_out_of_vocabulary(ctx, InvalidParameter)
