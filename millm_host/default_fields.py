"""Built-in plugin: the fields the host itself honours (and its limit on embeddings inputs), and the
headers it renders.

The engines claim the scoring fields and ``pooling``, which they serve themselves.
"""

from __future__ import annotations

from .context import RequestContext
from .engine import LAYER_HOOKS, LOGPROBS, SCORING
from .fields import ignored_fields_header
from .headers import serialize_item
from .hookspecs import hookimpl
from .settings import Setting

_SAMPLING = (
    "model",
    "stream",
    "stream_options",
    "stream_options.include_usage",
    "stream_options.continuous_usage_stats",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "frequency_penalty",
    "presence_penalty",
)
_MESSAGE = ("role", "content", "content[].type", "content[].text")

CHAT_FIELDS = (
    *_SAMPLING,
    "messages",
    *(f"messages[].{f}" for f in _MESSAGE),
    "extra_messages",
    *(f"extra_messages[][].{f}" for f in _MESSAGE),
    "include_reasoning",  # a model that thinks: whether the reply carries its block (``millm_host.reasoning``)
)
COMPLETION_FIELDS = (*_SAMPLING, "prompt", "add_special_tokens", "echo")
EMBEDDINGS_FIELDS = ("model", "input", "encoding_format", "normalize")
TOKENIZE_FIELDS = (
    "model",
    "prompt",
    "add_special_tokens",
    "messages",
    *(f"messages[].{f}" for f in _MESSAGE),
    "add_generation_prompt",
    "return_token_strs",
)
DETOKENIZE_FIELDS = ("model", "tokens")
#: Generation logprobs and logit_bias, on engines whose ``generate`` serves them.
CHAT_LOGPROBS_FIELDS = ("logprobs", "top_logprobs", "logit_bias")
COMPLETION_LOGPROBS_FIELDS = ("logprobs", "logit_bias")


@hookimpl(trylast=True)
def register_settings(register) -> None:
    register(
        Setting(
            "EMBEDDINGS_MAX_INPUTS",
            int,
            256,
            "Most strings one /v1/embeddings request may carry (400 invalid_parameter above)",
        )
    )
    register(
        Setting(
            "MILLM_EMBEDDING_TOKEN_IDS",
            str,
            "cl100k_base",
            "Whose ids a token-id /v1/embeddings input holds: cl100k_base (default) / o200k_base (OpenAI's "
            "tiktoken ids, as OpenAI's embeddings endpoint reads them and LangChain's OpenAIEmbeddings sends "
            "them: decoded to text and embedded as that text) or model (the model's own, as POST /tokenize "
            "gives them)",
        )
    )


@hookimpl(trylast=True)
def register_request_fields(register) -> None:
    register("chat.completions", CHAT_FIELDS)
    register("completions", COMPLETION_FIELDS)
    register("chat.completions", CHAT_LOGPROBS_FIELDS, requires=LOGPROBS)
    register("completions", COMPLETION_LOGPROBS_FIELDS, requires=LOGPROBS)
    # the prompt's own logprobs are scoring's pass (``serving.prompt_logprobs``)
    register("completions", ("prompt_logprobs",), requires=SCORING)
    # both replies as rows of one batch, the unsteered ones without the steering writes (``LayerHook.variant``)
    for endpoint in ("chat.completions", "completions"):
        register(endpoint, ("with_unsteered",), requires=LAYER_HOOKS, output_changing=True, scorable=False)
    register("embeddings", EMBEDDINGS_FIELDS)
    register("tokenize", TOKENIZE_FIELDS)
    register("detokenize", DETOKENIZE_FIELDS)


@hookimpl(trylast=True)
def render_headers(ctx: RequestContext) -> dict[str, str]:
    headers = {"X-miLLM-Model": ctx.model.id}
    if ctx.unused_fields:
        limit = ctx.settings["IGNORED_FIELDS_HEADER_MAX_BYTES"]
        headers["X-miLLM-Ignored-Fields"] = ignored_fields_header(ctx.unused_fields, limit)
    seed = getattr(ctx.params, "seed", None)
    if seed is not None:
        headers["X-miLLM-Seed"] = serialize_item(seed, {"scope": seed_scope(ctx)})
    return headers


def seed_scope(ctx: RequestContext) -> str:
    """What a seed promises for this request: ``request`` (the same seed, body and model give the same
    text) when its generation runs alone; ``batch-shape`` when the engine serves generations in a
    continuous batch, where the rows beside it (which the client does not choose) can round its
    logits apart. Scoring never batches. Known before generation, so a stream's header says it too."""
    batched = not ctx.scoring and ctx.engine is not None and ctx.engine.concurrent_generation
    return "batch-shape" if batched else "request"
