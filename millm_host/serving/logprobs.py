"""Generation logprobs and ``logit_bias``: what a request asks for, and each token's entry in OpenAI's shapes.

Chat asks with ``logprobs: true`` (and ``top_logprobs: k``), text completions with
``logprobs: k``; a request for one token that is not streamed is scoring mode
instead (``millm_host.scoring``). The engine yields ``GeneratedToken``s
(``SamplingParams.logprobs``); ``SequenceLogprobs`` turns them into entries on the
engine thread (it decodes tokens), and ``render`` shapes entries for the endpoint:
chat's ``{"content": [{token, logprob, bytes, top_logprobs}]}`` or the legacy
``{tokens, token_logprobs, top_logprobs, text_offset}`` of completions.

The distribution reported is the one each token was drawn from: the model's logits
after ``logit_bias``, the frequency and presence penalties, the plugins' logits
processors (a structured-output mask) and the temperature (none when greedy),
before the nucleus (``top_p``) cut. With ``temperature: 0`` the chosen token is
the most probable one, so its logprob is the largest of its ``top_logprobs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..context import RequestContext
from ..engine import Engine, GeneratedToken
from ..errors import InvalidParameter

#: What OpenAI reports for a token the distribution gives no probability (a logprob of -inf).
IMPOSSIBLE = -9999.0


def requested(ctx: RequestContext) -> int | None:
    """How many alternatives per token the request asks for; None: no logprobs asked."""
    params = ctx.params
    if ctx.is_chat:
        if params.top_logprobs is not None and params.logprobs is not True:
            raise InvalidParameter("top_logprobs needs logprobs: true", param="top_logprobs")
        return (params.top_logprobs or 0) if params.logprobs else None
    return None if params.logprobs is False else params.logprobs


def token_biases(ctx: RequestContext, vocab_size: int) -> dict[int, float]:
    """``logit_bias`` keyed by token id; an id outside the vocabulary is a 400."""
    biases = {int(key): float(bias) for key, bias in (ctx.params.logit_bias or {}).items()}
    outside = next((token for token in biases if token >= vocab_size), None)
    if outside is not None:
        raise InvalidParameter(
            f"logit_bias: token id {outside} is outside the vocabulary (size {vocab_size})", param="logit_bias"
        )
    return biases


@dataclass(frozen=True)
class Alternative:
    token: str
    logprob: float
    bytes: list[int]


@dataclass(frozen=True)
class TokenEntry(Alternative):
    """One generated token's logprobs: itself, its alternatives and where it starts in the text."""

    #: None (and ``logprob`` None) only for an echoed prompt's first token (``prompt_logprobs``).
    top: list[Alternative] | None = field(default_factory=list)
    #: Characters before this token in prompt plus completion (completions' ``text_offset``).
    offset: int = 0


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else IMPOSSIBLE


@dataclass
class SequenceLogprobs:
    """The entries of one sequence, built on the engine thread; ``pending`` are those not streamed yet."""

    engine: Engine
    offset: int
    entries: list[TokenEntry] = field(default_factory=list)
    sent: int = 0

    def add(self, token: int) -> None:
        """Record a generated token (an engine may yield a bare id for a token it has no logprobs for)."""
        if not isinstance(token, GeneratedToken):
            return
        chosen = self._alternative(int(token), token.logprob)
        top = [self._alternative(t.token_id, t.logprob) for t in token.top if math.isfinite(t.logprob)]
        self.entries.append(TokenEntry(chosen.token, chosen.logprob, chosen.bytes, top, self.offset))
        self.offset += len(chosen.token)

    def pending(self) -> list[TokenEntry]:
        """The entries since the last call (what the next streamed chunk carries)."""
        taken, self.sent = self.entries[self.sent :], len(self.entries)
        return taken

    def _alternative(self, token_id: int, logprob: float) -> Alternative:
        raw = self.engine.token_bytes(token_id)
        return Alternative(raw.decode("utf-8", "replace"), _finite(logprob), list(raw))


def prompt_chars(ctx: RequestContext, engine: Engine, prompt_index: int) -> int:
    """Characters of a completion's prompt (its first token's ``text_offset``); 0 on chat."""
    if ctx.is_chat:
        return 0
    prompt = ctx.params.prompts[prompt_index]
    return len(prompt) if isinstance(prompt, str) else len(engine.decode(prompt))


def render(ctx: RequestContext, entries: Sequence[TokenEntry] | None) -> dict[str, Any] | None:
    """A choice's ``logprobs`` in the endpoint's shape (None when none were asked)."""
    if entries is None:
        return None
    if ctx.is_chat:
        return {"content": [_chat_entry(e) for e in entries], "refusal": None}
    tops: list[dict[str, float] | None] = []
    for entry in entries:
        if entry.top is None:  # an echoed prompt's first token: nothing before it to score it
            tops.append(None)
            continue
        top: dict[str, float] = {}
        for alt in entry.top:
            top.setdefault(alt.token, alt.logprob)  # ids that decode alike share the best entry
        top.setdefault(entry.token, entry.logprob)  # the sampled token is always there, as OpenAI sends it
        tops.append(top)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": tops,
        "text_offset": [e.offset for e in entries],
    }


def _chat_entry(entry: TokenEntry) -> dict[str, Any]:
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": entry.bytes,
        "top_logprobs": [{"token": a.token, "logprob": a.logprob, "bytes": a.bytes} for a in entry.top or ()],
    }
