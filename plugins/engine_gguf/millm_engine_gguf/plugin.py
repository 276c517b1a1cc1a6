"""Hook implementations of the GGUF engine plugin.

Nothing here imports llama.cpp: the engine module loads only with a model.
"""

from __future__ import annotations

from millm_host.api import FieldNotHonoured, hookimpl

from .spec import ENGINE_NAME, SPEC

#: What the GGUF engine honours beyond the host's own fields. Chat and text
#: completions need nothing more (generation logprobs and logit_bias come with the
#: ``LOGPROBS`` capability): seed, n > 1, response_format, tools, steering and
#: scoring fields stay unclaimed or are refused by capability before any load,
#: and chat_template_kwargs and tool-call history are reported.
EMBEDDING_FIELDS = ("input", "encoding_format", "pooling", "normalize")
#: vLLM's names: the first stage of the sampler chain masks the end-of-sequence ids (``distribution``).
EOS_FIELDS = ("ignore_eos", "min_tokens")


@hookimpl
def register_engines(register) -> None:
    """Offer the ``gguf`` engine (llama-cpp-python)."""
    register(SPEC)


@hookimpl
def register_request_fields(register) -> None:
    """Claim the embedding fields the GGUF engine serves (pooling only as ``mean``), and ``ignore_eos`` and
    ``min_tokens`` on generation."""
    register("embeddings", EMBEDDING_FIELDS, engines=[ENGINE_NAME])
    register("chat.completions", EOS_FIELDS, engines=[ENGINE_NAME])
    register("completions", EOS_FIELDS, engines=[ENGINE_NAME])


@hookimpl
def validate_request(ctx) -> None:
    """Refuse, before any load, embeddings a GGUF model cannot give.

    llama.cpp fixes pooling when the model is loaded, and millm loads GGUF
    models with mean pooling; ``GGUF_ENABLE_EMBEDDINGS=false`` loads none.
    """
    if ctx.engine_name != ENGINE_NAME or ctx.endpoint != "embeddings":
        return
    pooling = ctx.body.get("pooling")
    if pooling is not None and pooling != "mean":
        raise FieldNotHonoured(
            f"pooling {pooling!r} cannot be honoured on the GGUF model {ctx.model.id!r}: llama.cpp fixes "
            'pooling at load and millm loads GGUF models with mean pooling; send pooling "mean"',
            param="pooling",
        )
    if not ctx.settings["GGUF_ENABLE_EMBEDDINGS"]:
        raise FieldNotHonoured(
            f"the GGUF model {ctx.model.id!r} cannot embed on this server: GGUF_ENABLE_EMBEDDINGS is false",
            param="model",
        )
