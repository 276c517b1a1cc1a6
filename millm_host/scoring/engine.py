"""What an engine scores: next-token parameters and results, and the errors of scoring.

Shared by the host (which serves scoring with no torch, ``.serving``) and the
engines (which do the math, ``Engine.score_next_token``); plugins reach these
through ``millm_host.api``. Engines raise these errors; the host renders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..errors import SERVER_ERROR, MillmError
from ..headers import Token, serialize_item

Precision = Literal["native", "float32"]

#: Why ``scoring_precision: "float32"`` can't be served (``X-miLLM-Scoring-Precision-Reason``).
PrecisionReason = Literal["model_not_float32_castable", "memory", "device", "busy"]


@dataclass(frozen=True)
class ScoringParams:
    """How to score the next token of each prompt.

    ``temperature`` divides the logits before normalising (0: no scaling).
    ``top`` is how many of the most probable candidates to report (fewer when there
    are fewer candidates). ``allowed_token_ids`` restricts the candidates and the
    normalisation to that set (None: the whole vocabulary).
    """

    temperature: float = 0.0
    top: int = 0
    allowed_token_ids: tuple[int, ...] | None = None
    precision: Precision = "native"


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float


@dataclass
class NextTokenScores:
    """One prompt's answer: the most probable candidate and the ``top`` best, best first."""

    chosen: TokenLogprob
    top: list[TokenLogprob] = field(default_factory=list)


@dataclass
class PromptTokenScores:
    """One prompt token's score (the second token on): its log-probability after the tokens before it,
    its ``rank`` in that distribution (1: the most probable) and the ``top`` most probable tokens there,
    best first. Unscaled (no temperature), over the whole vocabulary."""

    token: TokenLogprob
    rank: int
    top: list[TokenLogprob] = field(default_factory=list)


class InvalidScoringRequest(MillmError):
    """A scoring token id outside the vocabulary, or a prompt that tokenises to nothing."""

    status, code = 400, "invalid_scoring_request"


class NonFiniteLogits(MillmError):
    """NaN or +inf logits reached the answer, or a reported token's logit is -inf.

    ``index`` is the prompt (or conversation) that failed; the host names it.
    """

    status, code, type = 500, "non_finite_logits", SERVER_ERROR

    def __init__(self, message: str, *, index: int = 0) -> None:
        super().__init__(message)
        self.index = index


class ScoringPrecisionUnavailable(MillmError):
    """``scoring_precision: "float32"`` can't be served; never answered in another precision."""

    status, code = 409, "scoring_precision_unavailable"

    def __init__(self, reason: PrecisionReason, detail: str) -> None:
        super().__init__(
            f"scoring_precision float32 is unavailable ({reason}): {detail}",
            param="scoring_precision",
            headers={"X-miLLM-Scoring-Precision-Reason": serialize_item(Token(reason))},
        )
        self.reason = reason
