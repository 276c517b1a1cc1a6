"""``logit_bias``, penalties and logprobs on a GGUF model: the first stage of llama.cpp's sampler chain.

llama-cpp-python samples inside llama.cpp, so the logits the draw uses never
reach Python. When a request asks for logprobs or a ``logit_bias``, a
``Distribution`` goes in as the chain's custom first stage (``Llama.generate``'s
``logits_processor``): it adds the bias and the frequency and presence penalties
(llama.cpp's own penalty stage is then given zeros) and keeps the log-softmax of
the result over the temperature (unscaled when greedy). The rest of the chain
(the nucleus cut, the temperature, the draw) runs on what it returns, so the
logprobs are those of the distribution the token is drawn from, before the
nucleus cut: what the transformers engine reports. ``min_tokens`` (and ``ignore_eos``,
``SamplingParams.min_tokens``) masks the end-of-sequence ids here too, with -inf,
until that many tokens were drawn.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from millm_host.api import GeneratedToken, SamplingParams, TokenLogprob


class Distribution:
    """Called by llama.cpp once per token with the ids so far and the raw logits; returns the biased ones."""

    def __init__(self, params: SamplingParams, n_vocab: int, prompt_length: int, eos_ids: Collection[int] = ()) -> None:
        self.bias = np.zeros(n_vocab, dtype=np.float32)
        self.eos = np.array(sorted(t for t in eos_ids if t < n_vocab), dtype=np.int64)
        self.eos_until = params.min_tokens if self.eos.size else 0
        for token, bias in params.logit_bias.items():
            self.bias[token] += bias
        self.frequency = params.frequency_penalty
        self.presence = params.presence_penalty
        self.temperature = params.temperature if params.temperature > 0 else 1.0
        self.top = params.logprobs
        self.n_vocab = n_vocab
        self.prompt_length = prompt_length
        self.logprobs: np.ndarray | None = None

    def __call__(self, input_ids: np.ndarray | Sequence[int], logits: np.ndarray) -> np.ndarray:
        """``input_ids``: the prompt (``prompt_length`` ids) and the tokens drawn so far."""
        out = np.asarray(logits, dtype=np.float32) + self.bias
        if self.frequency or self.presence:
            counts = np.bincount(np.asarray(input_ids[self.prompt_length :], dtype=np.int64), minlength=self.n_vocab)
            out -= self.frequency * counts[: self.n_vocab] + self.presence * (counts[: self.n_vocab] > 0)
        if len(input_ids) - self.prompt_length < self.eos_until:
            out[self.eos] = -np.inf
        if self.top is not None:
            scaled = out.astype(np.float64) / self.temperature
            peak = scaled.max()
            self.logprobs = scaled - (peak + np.log(np.exp(scaled - peak).sum()))
        return out

    def token(self, token: int) -> int:
        """``token`` as the engine yields it: with its logprobs when they were asked for."""
        if self.top is None or self.logprobs is None:
            return token
        logprobs = self.logprobs
        count = min(self.top, logprobs.size)
        best = np.argpartition(-logprobs, count - 1)[:count] if count else np.empty(0, dtype=np.int64)
        best = best[np.argsort(-logprobs[best], kind="stable")]
        top = [TokenLogprob(int(i), float(logprobs[i])) for i in best]
        return GeneratedToken(token, float(logprobs[token]), top)


def needed(params: SamplingParams) -> bool:
    """Whether a request needs the custom stage (llama.cpp's own chain serves the rest)."""
    return params.logprobs is not None or bool(params.logit_bias) or params.min_tokens > 0
