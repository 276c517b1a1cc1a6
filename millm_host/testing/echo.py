"""The echo engine: a test engine with no torch and no weights, answering in microseconds.

Registered through the plugin manager like any engine (llm's ``MockModel``): the
in-process harness (``millm_host.testing.inprocess``) registers this module as a
plugin. A model is a directory whose ``config.json`` has a ``millm_echo`` object
(``echo_model_dir`` writes one), so the host's registry discovers it as usual.

Text is tokenized byte by byte (a token id is a UTF-8 byte); EOS is one more id.
A chat renders as ``<|role|>content<|end|>`` blocks, and the reply echoes the last
user message (a completion echoes its prompt), or the model's fixed ``reply``.
Sampling is greedy at any temperature and seed: the scripted token has logit 0,
every other ``OTHER_LOGIT``; ``logit_bias`` is added to them, so a bias can force
or ban a token, and ``logprobs`` are their log-softmax. Logits processors see
plain lists of floats, so only processors that do no tensor math (e.g. the
fault-injection plugin) can run on it. It has no layer hooks and cannot
score; it embeds (``mean``, ``last`` and ``cls`` pooling) into a small vector.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..engine import (
    LOGPROBS,
    Engine,
    EngineSpec,
    GeneratedToken,
    LayerHook,
    ModelDescriptor,
    ModelInfo,
    SamplingParams,
)
from ..hookspecs import hookimpl
from ..scoring.engine import TokenLogprob

ENGINE_NAME = "echo"
EOS = 256
VOCAB_SIZE = 257
EMBEDDING_SIZE = 8
CONFIG_KEY = "millm_echo"
#: The logit of every token but the scripted one (finite, so a logit_bias can lift one past it).
OTHER_LOGIT = -20.0

SPEC = EngineSpec(
    name=ENGINE_NAME,
    factory="millm_host.testing.echo:EchoEngine",
    describe="millm_host.testing.echo:describe",
    formats=frozenset({"hf"}),
    capabilities=frozenset({LOGPROBS}),
)


def echo_model_dir(
    path: Path,
    *,
    context_window: int | None = 512,
    reply: str | None = None,
    load_error: str | None = None,
    hf_id: str | None = None,
) -> Path:
    """Write an echo model directory at ``path`` (its name is the model id).

    ``reply`` fixes the answer; ``load_error`` makes loading the model fail with that message;
    ``hf_id`` is the repository the model says it was made from (an alias of its id).
    """
    path.mkdir(parents=True, exist_ok=True)
    config = {CONFIG_KEY: {"context_window": context_window, "reply": reply, "load_error": load_error, "hf_id": hf_id}}
    (path / "config.json").write_text(json.dumps(config))
    return path


def _config(path: str | Path) -> dict[str, Any] | None:
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = config.get(CONFIG_KEY) if isinstance(config, dict) else None
    return found if isinstance(found, dict) else None


def describe(path: str) -> ModelDescriptor | None:
    """An echo model directory as this engine serves it; None for anything else."""
    config = _config(path)
    if config is None:
        return None
    return ModelDescriptor(
        id=Path(path).name, path=str(path), format="hf", engine=ENGINE_NAME, hf_id=config.get("hf_id")
    )


class EchoEngine(Engine):
    """Bytes in, the same bytes back."""

    name = ENGINE_NAME

    def __init__(self, descriptor: ModelDescriptor, context_window: int | None = 512, reply: str | None = None) -> None:
        self.reply = reply
        self.info = ModelInfo(
            id=descriptor.id,
            engine=ENGINE_NAME,
            hf_id=None,
            revision=None,
            dtype=None,
            quantization=None,
            context_window=context_window,
            vocab_size=VOCAB_SIZE,
            d_model=EMBEDDING_SIZE,
            n_layers=0,
            chat_template="echo",
            bos_token=None,
            bos_token_id=None,
            eos_token_ids=frozenset({EOS}),
        )

    @classmethod
    def load(cls, descriptor: ModelDescriptor, settings: Any, progress: Callable[[str], None]) -> EchoEngine:
        config = _config(descriptor.path) or {}
        if config.get("load_error"):
            raise RuntimeError(config["load_error"])
        return cls(descriptor, config.get("context_window", 512), config.get("reply"))

    # --- text -----------------------------------------------------------------------
    def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def min_tokens(self, texts: Sequence[str]) -> int:
        return sum(map(len, texts))  # a token a byte, and a character is at least one

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if i < EOS).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < EOS else b""

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        text = "".join(f"<|{m['role']}|>{m.get('content') or ''}<|end|>" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")

    def reply_to(self, prompt: str) -> str:
        """What this engine answers to a rendered prompt."""
        if self.reply is not None:
            return self.reply
        head, marker, last = prompt.rpartition("<|user|>")
        if not marker:
            return prompt
        return last.partition("<|end|>")[0]

    # --- compute --------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        hooks: Sequence[LayerHook] = (),
        logits_processors: Sequence[Callable[[Sequence[int], Any], Any]] = (),
    ) -> Generator[int, None, None]:
        script = [*self.tokenize(self.reply_to(self.decode(prompt_ids))), EOS]
        generated: list[int] = []
        while True:
            target = script[len(generated)] if len(generated) < len(script) else EOS
            logits: Any = [OTHER_LOGIT] * VOCAB_SIZE
            logits[target] = 0.0
            for token_id, bias in params.logit_bias.items():
                logits[token_id] += bias
            for process in logits_processors:
                logits = process(generated, logits)
            token = max(range(VOCAB_SIZE), key=lambda i: logits[i])
            generated.append(token)
            yield token if params.logprobs is None else _with_logprobs(token, logits, params.logprobs)

    def embed(self, ids: Sequence[int], pooling: str = "mean") -> list[float]:
        def features(token: int) -> list[float]:
            return [math.sin((token + 1) * (k + 1)) for k in range(EMBEDDING_SIZE)]

        if pooling == "last":
            return features(ids[-1])
        if pooling == "cls":
            return features(ids[0])
        rows = [features(t) for t in ids]
        return [sum(column) / len(rows) for column in zip(*rows, strict=True)]


def _with_logprobs(token: int, logits: Sequence[float], top: int) -> GeneratedToken:
    """``token`` with the log-softmax of ``logits`` (greedy: unscaled) for it and the ``top`` best."""
    finite = [x for x in logits if math.isfinite(x)]
    peak = max(finite)
    norm = peak + math.log(math.fsum(math.exp(x - peak) for x in finite))
    best = sorted(range(len(logits)), key=lambda i: -logits[i])[:top]
    return GeneratedToken(token, logits[token] - norm, [TokenLogprob(i, logits[i] - norm) for i in best])


# --- the plugin ------------------------------------------------------------------------


@hookimpl
def register_engines(register: Callable[[EngineSpec], None]) -> None:
    register(SPEC)


@hookimpl
def register_request_fields(register: Callable[..., None]) -> None:
    engines = [ENGINE_NAME]
    register("chat.completions", ("seed", "n", "chat_template_kwargs"), engines=engines)
    register("completions", ("seed", "n"), engines=engines)
    register("embeddings", ("pooling",), engines=engines)
