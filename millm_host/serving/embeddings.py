"""``POST /v1/embeddings``: ``ServingEmbeddings``, one vector per input, pooled from the last hidden layer, never steered.

An input is text or token ids (as OpenAI accepts token arrays). By default the ids are
OpenAI's, as its embeddings endpoint reads them (``MILLM_EMBEDDING_TOKEN_IDS=cl100k_base``):
each id list is decoded to its text and embedded as that text, which is what LangChain's
``OpenAIEmbeddings`` sends with its defaults. With ``model`` they are the model's own, as vLLM
and llama.cpp's server take them (``POST /tokenize`` gives them), checked against its vocabulary.
No HTTP here and no tensor math: inputs are checked before any model load, every
input is tokenized and measured before anything runs (inputs are never
truncated), the engine pools each vector on the engine thread (with no layer hook
installed), and the host normalises, checks and encodes the vectors.
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any, cast

from ..context import RequestContext
from ..errors import SERVER_ERROR, ContextLengthExceeded, InvalidParameter, MillmError
from ..protocol import EmbeddingRequest
from ..response_bodies import EmbeddingData, EmbeddingResponse, EmbeddingUsage
from ..tiktoken_vocab import NAMES as TIKTOKEN_VOCABULARIES, ranks
from .base import Serving, ServingHost

#: Over-limit inputs named one by one in a context_length_exceeded message.
NAMED_OVER_LIMIT = 16


class EmbeddingVectorInvalid(MillmError):
    """An embedding vector is non-finite, or has a zero norm under ``normalize``."""

    status, code, type = 500, "embedding_vector_invalid", SERVER_ERROR


class ServingEmbeddings(Serving):
    """Embeddings; per request, ``ctx.plan`` is the list of inputs."""

    endpoint = "embeddings"
    protocol = EmbeddingRequest
    response_model = EmbeddingResponse

    def __init__(self, host: ServingHost) -> None:
        super().__init__(host)
        #: Whose token ids an id input holds: ``model``, or a tiktoken vocabulary its ids are decoded with.
        self.token_ids = host.settings["MILLM_EMBEDDING_TOKEN_IDS"]
        if self.token_ids not in ("model", *TIKTOKEN_VOCABULARIES):
            choices = ", ".join(("model", *TIKTOKEN_VOCABULARIES))
            raise ValueError(f"MILLM_EMBEDDING_TOKEN_IDS={self.token_ids!r} is not one of {choices}")

    def read(self, ctx: RequestContext) -> None:
        """The inputs, OpenAI token ids decoded to text when so configured (worker thread, before any load)."""
        ctx.plan = inputs_of(ctx.params, self.host.settings["EMBEDDINGS_MAX_INPUTS"])
        if self.token_ids != "model":
            ctx.plan = decode_tiktoken_ids(ctx.plan, self.token_ids, flat=is_one_id_list(ctx.params.input))

    def refuse_unfitting_text(self, ctx: RequestContext) -> None:
        engine = ctx.engine
        assert engine is not None
        floors = [engine.min_tokens([item]) if isinstance(item, str) else 0 for item in ctx.plan]
        check_lengths(ctx, floors, engine.embedding_window, at_least=True)

    def tokenize(self, ctx: RequestContext) -> None:
        """Every input tokenized and measured before anything runs: none is ever truncated."""
        engine = ctx.engine
        assert engine is not None
        refuse_unknown_ids(ctx, engine.info.vocab_size)
        ctx.prompts = [list(item) if isinstance(item, list) else engine.tokenize(item) for item in ctx.plan]
        for i, ids in enumerate(ctx.prompts):
            if not ids:
                raise InvalidParameter(f"input[{i}] tokenises to nothing", param="input")
        check_lengths(ctx, [len(ids) for ids in ctx.prompts], engine.embedding_window)

    def run(self, ctx: RequestContext) -> list[list[float]]:
        """Each input's vector, pooled by the engine, checked and normalised here (engine thread)."""
        engine = ctx.engine
        assert engine is not None
        pooling = ctx.params.pooling or "mean"
        normalize = bool(ctx.params.normalize)
        return [finish_vector(engine.embed(ids, pooling), i, normalize) for i, ids in enumerate(ctx.prompts)]

    def render(self, ctx: RequestContext, output: list[list[float]]) -> dict[str, Any]:
        tokens = sum(len(ids) for ids in ctx.prompts)
        response = EmbeddingResponse(
            object="list",
            data=[
                EmbeddingData(object="embedding", index=i, embedding=encode(v, ctx.params.encoding_format or "float"))
                for i, v in enumerate(output)
            ],
            model=ctx.served_model,
            usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
        )
        return response.model_dump(mode="json")


def inputs_of(params: EmbeddingRequest, max_inputs: int) -> list[str | list[int]]:
    """The inputs as a list (text, or token ids); empty ones and too many are refused (no model needed)."""
    if isinstance(params.input, str):
        if not params.input:
            raise InvalidParameter("input is an empty string; send text to embed", param="input")
        return [params.input]
    if not params.input:
        raise InvalidParameter("input is an empty list; send at least one string or token id", param="input")
    if is_one_id_list(params.input):
        return [cast("list[int]", params.input)]  # one input given as token ids (not copied: 2M ids took 50 ms)
    if len(params.input) > max_inputs:
        raise InvalidParameter(
            f"input has {len(params.input)} inputs; at most {max_inputs} are accepted (EMBEDDINGS_MAX_INPUTS)",
            param="input",
        )
    empty = [i for i, item in enumerate(params.input) if not item]
    if empty:
        named = ", ".join(f"input[{i}]" for i in empty[:NAMED_OVER_LIMIT])
        more = f" and {len(empty) - NAMED_OVER_LIMIT} more" if len(empty) > NAMED_OVER_LIMIT else ""
        raise InvalidParameter(f"empty inputs cannot be embedded: {named}{more}", param="input")
    return cast("list[str | list[int]]", list(params.input))


def is_one_id_list(value: Any) -> bool:
    """Whether ``input`` is one input sent as token ids (``[1, 2, 3]``), not a list of inputs."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], int)


def decode_tiktoken_ids(plan: list[str | list[int]], vocabulary: str, *, flat: bool) -> list[str | list[int]]:
    """Each token-id input as the text it stands for in tiktoken ``vocabulary``; text inputs unchanged.

    An id past the vocabulary (its special tokens included) is refused naming ``input[i][j]``, an input
    whose bytes are not UTF-8 naming ``input[i]`` (``input[j]`` and ``input`` for one flat id list).
    """
    if all(isinstance(item, str) for item in plan):
        return plan  # text only: the vocabulary is not even read
    table = ranks(vocabulary)
    decoded: list[str | list[int]] = []
    for i, item in enumerate(plan):
        if isinstance(item, str):
            decoded.append(item)
            continue
        outside = _first_outside(item, len(table))
        if outside is not None:
            j, token = outside
            where = f"input[{j}]" if flat else f"input[{i}][{j}]"
            raise InvalidParameter(
                f"{where}: token id {token} is outside {vocabulary} (ids 0-{len(table) - 1}; special tokens "
                f"are not embedded). MILLM_EMBEDDING_TOKEN_IDS={vocabulary}: token ids are read as OpenAI's",
                param=where,
            )
        where = "input" if flat else f"input[{i}]"
        try:
            decoded.append(_joined(item, table).decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidParameter(
                f"{where}: the token ids are not UTF-8 text under {vocabulary} (a character split between "
                "inputs?); send each text's ids whole",
                param=where,
            ) from None
    return decoded


#: Ids one C call looks at or joins: one ``bytes.join`` over 2M tokens' bytes held the GIL for most of a
#: second, and a Python loop over them took 170 ms of a loaded machine's CPU (the event loop waited behind it).
JOIN_SLICE = 4096


def _first_outside(ids: list[int], size: int) -> tuple[int, int] | None:
    """(index, id) of the first id of ``ids`` past ``size``, or None; a slice's ``max`` at a time."""
    for start in range(0, len(ids), JOIN_SLICE):
        chunk = ids[start : start + JOIN_SLICE]
        if max(chunk) >= size:
            j = next(k for k, token in enumerate(chunk) if token >= size)
            return start + j, chunk[j]
    return None


def _joined(ids: list[int], table: tuple[bytes, ...]) -> bytes:
    """The bytes of ``ids`` under ``table``, a slice of ids per C call (the last join copies a few large parts)."""
    return b"".join(
        [b"".join(map(table.__getitem__, ids[start : start + JOIN_SLICE])) for start in range(0, len(ids), JOIN_SLICE)]
    )


def refuse_unknown_ids(ctx: RequestContext, vocab_size: int) -> None:
    """Refuse a token id outside the model's vocabulary, naming where it is (``input[1][7]``)."""
    flat = is_one_id_list(ctx.params.input)
    for i, item in enumerate(ctx.plan):
        if isinstance(item, str):
            continue
        for j, token in enumerate(item):
            if token >= vocab_size:
                where = f"input[{j}]" if flat else f"input[{i}][{j}]"
                raise InvalidParameter(
                    f"{where}: token id {token} is outside this model's vocabulary (ids 0-{vocab_size - 1}). "
                    "Token ids are the model's own (POST /tokenize gives them), not OpenAI's: LangChain's "
                    "OpenAIEmbeddings sends OpenAI tiktoken ids unless check_embedding_ctx_length=False "
                    "(or the server runs with MILLM_EMBEDDING_TOKEN_IDS=cl100k_base)",
                    param=where,
                )


def check_lengths(ctx: RequestContext, lengths: list[int], window: int | None, *, at_least: bool = False) -> None:
    """Refuse the request if any input is over the model's window, naming every one (``at_least``:
    ``lengths`` are lower bounds)."""
    if window is None:
        return  # a model that states no limit is embedded unchecked
    over = [(i, n) for i, n in enumerate(lengths) if n > window]
    if not over:
        return
    least = "at least " if at_least else ""
    named = ", ".join(f"input[{i}] ({least}{n} tokens)" for i, n in over[:NAMED_OVER_LIMIT])
    more = f", and {len(over) - NAMED_OVER_LIMIT} more" if len(over) > NAMED_OVER_LIMIT else ""
    single = isinstance(ctx.params.input, str) or is_one_id_list(ctx.params.input)
    param = "input" if single else f"input[{over[0][0]}]"
    raise ContextLengthExceeded(
        f"this model's maximum context length is {window} tokens and inputs are never truncated; "
        f"over the limit: {named}{more}. Shorten or split them",
        param=param,
    )


def finish_vector(vector: list[float], index: int, normalize: bool) -> list[float]:
    """Check (and L2-normalise) one vector; never return NaN or infinity."""
    if not all(math.isfinite(v) for v in vector):
        raise EmbeddingVectorInvalid(f"the embedding of input[{index}] is not finite", param=f"input[{index}]")
    if not normalize:
        return vector
    norm = math.sqrt(math.fsum(v * v for v in vector))
    if norm == 0.0 or not math.isfinite(norm):
        raise EmbeddingVectorInvalid(
            f"the embedding of input[{index}] has a {'zero' if norm == 0.0 else 'non-finite'} norm and cannot be normalised",
            param=f"input[{index}]",
        )
    return [v / norm for v in vector]


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """Floats, or base64 of little-endian float32 (what the openai SDK asks for)."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector
