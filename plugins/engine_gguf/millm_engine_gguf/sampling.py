"""How a row of the batch (``batch``) turns its logits into a token, as the serial engine would.

The serial engine samples inside llama.cpp (``engine._tokens``); a batch row samples
here with numpy, from the logits llama.cpp left for it. What the request asks of
the logits before the draw is done as the serial chain does it, so a greedy row
picks the token the serial engine picks from the same logits:

- ``logit_bias``, logprobs and ``min_tokens``: the serial chain's custom first stage,
  ``distribution.Distribution`` itself (penalties included, as there);
- frequency and presence penalties alone: llama.cpp's penalty stage, in float32
  (``Penalties``).

Then greedy is the first best logit (llama.cpp's greedy sampler), and temperature
with ``top_p`` draws from the row's own numpy generator, seeded by ``seed``.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from millm_host.api import SamplingParams

from .distribution import Distribution, needed


class Penalties:
    """llama.cpp's frequency and presence penalties over the tokens sampled so far (float32, as its sampler)."""

    def __init__(self, params: SamplingParams) -> None:
        self.frequency = np.float32(params.frequency_penalty)
        self.presence = np.float32(params.presence_penalty)
        self.counts: dict[int, int] = {}

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        if not self.counts:
            return logits
        ids = np.fromiter(self.counts, dtype=np.intp, count=len(self.counts))
        counts = np.fromiter(self.counts.values(), dtype=np.float32, count=len(self.counts))
        out = logits.copy()
        out[ids] -= counts * self.frequency + self.presence
        return out

    def accept(self, token: int) -> None:
        self.counts[token] = self.counts.get(token, 0) + 1


class RowSampler:
    """One row's sampling: its stage before the draw (if any), its draw, and what it yields."""

    def __init__(self, params: SamplingParams, n_vocab: int, eos_ids: Collection[int]) -> None:
        self.params = params
        self.greedy = params.temperature == 0
        self.rng = np.random.default_rng(params.seed)
        self.generated: list[int] = []
        self.distribution = Distribution(params, n_vocab, 0, eos_ids) if needed(params) else None
        self.penalties = (
            Penalties(params)
            if self.distribution is None and (params.frequency_penalty or params.presence_penalty)
            else None
        )
        #: Plain greedy: the batch takes its argmax with the other plain greedy rows'.
        self.plain_greedy = self.greedy and self.distribution is None and self.penalties is None

    def __call__(self, logits: np.ndarray) -> int:
        """The next token from this row's logits (a ``GeneratedToken`` when logprobs were asked)."""
        if self.distribution is not None:
            logits = self.distribution(self.generated, logits)
        elif self.penalties is not None:
            logits = self.penalties(logits)
        token = int(np.argmax(logits)) if self.greedy else draw(logits, self.params, self.rng)
        return self.accept(token)

    def accept(self, token: int) -> int:
        """Record ``token`` as sampled; what the row yields for it."""
        if self.distribution is not None:
            self.generated.append(token)
            return self.distribution.token(token)
        if self.penalties is not None:
            self.penalties.accept(token)
        return token


def draw(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Softmax at the temperature, cut to the ``top_p`` nucleus, one draw from ``rng``."""
    scaled = logits.astype(np.float64) / params.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p >= 1.0:  # no nucleus to cut: no sort of the vocabulary (most of a draw's time)
        return int(rng.choice(len(probs), p=probs))
    order = np.argsort(-probs, kind="stable")
    cumulative = np.cumsum(probs[order])
    order = order[: int(np.searchsorted(cumulative, params.top_p)) + 1]
    kept = probs[order] / probs[order].sum()
    return int(order[rng.choice(len(order), p=kept)])
