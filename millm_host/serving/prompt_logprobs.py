"""The prompt's own logprobs on ``/v1/completions``: ``echo`` (OpenAI's legacy shape) and ``prompt_logprobs`` (vLLM's).

``echo: true`` puts the prompt before the completion: its text always, and with
``logprobs: k`` its tokens' entries before the generated ones (the first token's
logprob and top_logprobs are null: nothing precedes it). ``prompt_logprobs: k``
adds each choice's ``prompt_logprobs``: null for the first prompt token, then per
token ``{"<id>": {"logprob", "rank", "decoded_token"}}`` for it and its ``k`` best
alternatives. Both work with ``max_tokens: 0`` (nothing generated). This is how
lm-evaluation-harness scores multiple choice (``echo: true, logprobs: 1``).

The numbers are scoring mode's: the engine's ``score_prompt`` makes scoring's pass
over the whole prompt (native precision, no temperature, no ``logit_bias``, no
hook), on the engine thread before the first sequence is generated, so token
``i``'s logprob is what scoring the ``i`` tokens before it answers. The prompt
is therefore never steered: a request that steers is refused, as scoring refuses
it. An engine that cannot score refuses ``echo`` with ``logprobs`` here, and
``prompt_logprobs`` through the field registry, with ``400 field_not_honoured``;
``echo`` alone (the text) is served everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..context import RequestContext
from ..engine import SCORING, Engine
from ..errors import FieldNotHonoured
from ..fields import is_no_change
from ..scoring.engine import NonFiniteLogits, PromptTokenScores
from .logprobs import Alternative, TokenEntry, requested

#: Fields that steer the forward: the prompt's logprobs are scoring's, which is never steered.
STEERING_FIELDS = ("profile", "steering", "steering_intensity")


@dataclass
class PromptLogprobs:
    """What a completion asks of its prompt (``ctx.plan``), and the answers, per prompt, once scored."""

    echo: bool
    #: Alternatives per echoed prompt token (echo with ``logprobs``); None: no prompt entries.
    logprobs: int | None
    prompt_logprobs: int | None
    #: Per prompt: its tokens' entries in the legacy shape (echo with logprobs).
    entries: list[list[TokenEntry]] = field(default_factory=list)
    #: Per prompt: vLLM's ``prompt_logprobs`` list.
    listed: list[list[dict[str, Any] | None]] = field(default_factory=list)

    @property
    def scored(self) -> bool:
        """Whether the prompt's tokens are scored (not only its text echoed)."""
        return self.logprobs is not None or self.prompt_logprobs is not None


def read(ctx: RequestContext) -> PromptLogprobs | None:
    """What the request asks of its prompt (None: nothing); refused before any load where it cannot be served."""
    params = ctx.params
    echo = bool(params.echo)
    if not echo and params.prompt_logprobs is None:
        return None
    plan = PromptLogprobs(echo, requested(ctx) if echo else None, params.prompt_logprobs)
    if not plan.scored:
        return plan
    param = "echo" if plan.logprobs is not None else "prompt_logprobs"
    if SCORING not in ctx.engine_capabilities:
        raise FieldNotHonoured(
            f"the {ctx.engine_name} engine cannot score a prompt's tokens: echo with logprobs and "
            "prompt_logprobs are not served on its models (echo alone is)",
            param=param,
        )
    for name in STEERING_FIELDS:
        if name in ctx.body and not is_no_change(name, ctx.body[name]):
            raise FieldNotHonoured(
                f"{name} cannot be combined with {param}: the prompt's logprobs are scoring mode's, which is "
                "never steered",
                param=name,
            )
    return plan


def score(ctx: RequestContext) -> None:
    """Score every prompt's tokens (engine thread), when the request asks for them."""
    plan = ctx.plan
    if not isinstance(plan, PromptLogprobs) or not plan.scored:
        return
    engine = ctx.engine
    assert engine is not None
    try:
        scores = engine.score_prompt(ctx.prompts, max(plan.logprobs or 0, plan.prompt_logprobs or 0))
    except NonFiniteLogits as exc:
        where = "prompt" if len(ctx.prompts) <= 1 else f"prompt[{exc.index}]"
        failed = NonFiniteLogits(f"{where}: {exc.message}", index=exc.index)
        failed.param = where
        raise failed from None
    for ids, rows in zip(ctx.prompts, scores, strict=True):
        if plan.logprobs is not None:
            plan.entries.append(_entries(engine, ids, rows, plan.logprobs))
        if plan.prompt_logprobs is not None:
            plan.listed.append([None, *(_listed(engine, row, plan.prompt_logprobs) for row in rows)])


def _entries(engine: Engine, ids: list[int], rows: list[PromptTokenScores], top: int) -> list[TokenEntry]:
    """The prompt's tokens in the legacy shape: the first with no logprob, each at its offset in the prompt."""
    first = _alternative(engine, ids[0], None)
    entries = [TokenEntry(first.token, first.logprob, first.bytes, None, 0)]
    offset = len(first.token)
    for row in rows:
        chosen = _alternative(engine, row.token.token_id, row.token.logprob)
        alternatives = [_alternative(engine, t.token_id, t.logprob) for t in row.top[:top]]
        entries.append(TokenEntry(chosen.token, chosen.logprob, chosen.bytes, alternatives, offset))
        offset += len(chosen.token)
    return entries


def _listed(engine: Engine, row: PromptTokenScores, top: int) -> dict[str, Any]:
    """One prompt token in vLLM's ``prompt_logprobs`` shape: it and its ``top`` best alternatives, by id."""
    ranked = [(row.token, row.rank), *((t, rank) for rank, t in enumerate(row.top[:top], start=1))]
    listed: dict[str, Any] = {}
    for token, rank in ranked:
        listed.setdefault(
            str(token.token_id),
            {"logprob": token.logprob, "rank": rank, "decoded_token": _alternative(engine, token.token_id, 0.0).token},
        )
    return listed


def _alternative(engine: Engine, token_id: int, logprob: float | None) -> Alternative:
    raw = engine.token_bytes(token_id)
    return Alternative(raw.decode("utf-8", "replace"), logprob, list(raw))  # type: ignore[arg-type]


def echoed(ctx: RequestContext, prompt_index: int) -> tuple[str, list[TokenEntry] | None] | None:
    """What choice of prompt ``prompt_index`` starts with: the prompt's text and (echo with logprobs) its
    entries; None without echo."""
    plan = ctx.plan
    if not isinstance(plan, PromptLogprobs) or not plan.echo:
        return None
    engine = ctx.engine
    assert engine is not None
    prompt = ctx.params.prompts[prompt_index]
    text = prompt if isinstance(prompt, str) else engine.decode(prompt)  # as ``prompt_chars`` counts it
    return text, plan.entries[prompt_index] if plan.logprobs is not None else None


def listed(ctx: RequestContext, prompt_index: int) -> list[dict[str, Any] | None] | None:
    """Choice ``prompt_index``'s ``prompt_logprobs`` (None: not asked)."""
    plan = ctx.plan
    if not isinstance(plan, PromptLogprobs) or plan.prompt_logprobs is None:
        return None
    return plan.listed[prompt_index]
