"""Windows: which positions a probe's score is taken over.

``all`` is every position with a residual, ``prompt`` those before the prompt
boundary, ``response`` the rest, ``last_user`` the newest user message (its
header included). For a model that thinks (``millm_host.reasoning``), ``reasoning``
is the reply's thinking block (from its first position, the opening marker's or the
first generated token when the template opened the block, through the token that
completed the closing marker; the whole reply when it never closed) and ``answer``
the reply after it; for a reply that is not split (a model that does not think, a
text completion) ``answer`` is the whole reply and ``reasoning`` says
``reasoning_not_split``, for a reply without a block it says ``no_reasoning_block``. With ``skip_template_prefix`` the template prefix (the longest
common prefix of the request's ids and the template's render of one empty user
message, up to that message's header) is left out of ``all``, ``prompt`` and
``last_user``. Boundaries are measured from the request's own ids, never guessed:
when one cannot be, the window says why instead of scoring.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from millm_host.api import Markers, reasoning_span

# Stands in for a message's content so the render shows where its header ends.
SENTINEL = "\u2063millm\u2063probe\u2063sentinel\u2063"
SENTINEL_2 = "\u2063millm\u2063probe\u2063second\u2063"


@dataclass(frozen=True)
class Span:
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class NotScored:
    """A window that cannot be read: its outcome (``skipped``/``failed``) and reason code."""

    outcome: str
    reason: str


@dataclass
class Layout:
    """What is known about one sequence's positions."""

    positions: int  # positions that hold a residual
    prompt_len: int | None = None  # None: the prompt boundary is unknown
    boundary_failure: str | None = None  # prompt_boundary_invalid / prompt_boundary_conflict
    prefix: int | None = None  # template prefix length; None: unknown
    last_user: Span | None = None
    last_user_reason: str = "last_user_span_unknown"
    reasoning: Span | None = None  # the thinking block's positions (``reasoning``); None: no block
    reasoning_reason: str = "reasoning_not_split"


def window_span(layout: Layout, window: str, skip_prefix: bool) -> Span | NotScored:
    """The positions ``window`` covers, or why it cannot be scored."""
    if window in ("prompt", "response", "reasoning", "answer"):
        if layout.boundary_failure:
            return NotScored("failed", layout.boundary_failure)
        if layout.prompt_len is None:
            return NotScored("skipped", "prompt_boundary_unknown")
    if window == "last_user" and layout.last_user is None:
        return NotScored("skipped", layout.last_user_reason)
    if window == "reasoning" and layout.reasoning is None:
        return NotScored("skipped", layout.reasoning_reason)
    start = 0
    if skip_prefix and window in ("all", "prompt", "last_user"):
        if layout.prefix is None:
            return NotScored("skipped", "template_prefix_unknown")
        start = layout.prefix
    end = layout.positions
    prompt_len, last_user = layout.prompt_len, layout.last_user  # known where needed: checked above
    if window == "prompt":
        assert prompt_len is not None
        end = min(end, prompt_len)
    elif window == "response":
        assert prompt_len is not None
        start = prompt_len
    elif window == "last_user":
        assert last_user is not None
        start, end = max(start, last_user.start), min(end, last_user.end)
    elif window == "reasoning":
        assert layout.reasoning is not None
        start, end = layout.reasoning.start, min(end, layout.reasoning.end)
    elif window == "answer":
        assert prompt_len is not None
        start = prompt_len if layout.reasoning is None else layout.reasoning.end
    if end <= start:
        return NotScored("skipped", "no_scored_tokens")
    return Span(start, end)


# --- measuring boundaries from the ids --------------------------------------------------


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def template_prefix_ids(engine: Any) -> list[int] | None:
    """The template's render of one empty user message, up to the end of its header."""
    try:
        text = engine.render_chat([{"role": "user", "content": SENTINEL}], add_generation_prompt=False)
    except Exception:
        return None
    cut = text.find(SENTINEL)
    return None if cut < 0 else engine.tokenize_chat_text(text[:cut])


def last_user_span(
    engine: Any,
    messages: Sequence[Mapping[str, Any]],
    ids: Sequence[int],
    *,
    tools: Any = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> Span | str:
    """The newest user message's positions in ``ids`` (header included), or a reason code.

    The header is found from the template itself: rendering the conversation with
    one more user message shows the text that opens a user turn.
    """
    if engine.info.chat_template is None:
        return "no_chat_template"
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None:
        return "no_user_turn"
    head = [dict(m) for m in messages[:last]]

    def render(conversation: list[dict[str, Any]]) -> str:
        return engine.render_chat(
            conversation, add_generation_prompt=False, tools=tools, template_kwargs=template_kwargs
        )

    try:
        one = render([*head, {"role": "user", "content": SENTINEL}])
        two = render([*head, {"role": "user", "content": SENTINEL}, {"role": "user", "content": SENTINEL_2}])
        real = render([*head, dict(messages[last])])
    except Exception:
        return "last_user_span_unresolved"
    at = one.find(SENTINEL)
    first, second = two.find(SENTINEL), two.find(SENTINEL_2)
    if at < 0 or first < 0 or second < 0:
        return "last_user_span_unresolved"
    closing = one[at + len(SENTINEL) :]  # what ends a user turn (nothing follows in ``one``)
    between = two[first + len(SENTINEL) : second]
    if not between.startswith(closing):
        return "last_user_span_unresolved"
    header = between[len(closing) :]
    if not header or not one[:at].endswith(header):
        return "last_user_span_unresolved"
    before = engine.tokenize_chat_text(one[: at - len(header)])
    through = engine.tokenize_chat_text(real)
    start, end = common_prefix(before, ids), common_prefix(through, ids)
    if start < len(before) or end <= start:
        return "no_user_header"
    return Span(start, end)


def measure(
    engine: Any,
    ids: Sequence[int],
    positions: int,
    *,
    prompt_len: int | None,
    prefix_ids: Sequence[int] | None,
    boundary_failure: str | None = None,
    conversation: Sequence[Mapping[str, Any]] | None = None,
    no_turns: str = "last_user_span_unknown",
    tools: Any = None,
    template_kwargs: Mapping[str, Any] | None = None,
    need_last_user: bool = False,
    markers: Markers | None = None,
    need_reasoning: bool = False,
) -> Layout:
    """The layout of one sequence: its boundaries as far as its own ids establish them.

    ``no_turns`` is the reason ``last_user`` gives when there is no conversation. ``markers``: the
    thinking markers the reply is split on (None: it is not split).
    """
    layout = Layout(
        positions=positions,
        prompt_len=prompt_len,
        boundary_failure=boundary_failure,
        prefix=common_prefix(ids, prefix_ids) if prefix_ids is not None else None,
        last_user_reason=no_turns,
    )
    if need_last_user and conversation is not None:
        span = last_user_span(engine, conversation, ids, tools=tools, template_kwargs=template_kwargs)
        if isinstance(span, Span):
            layout.last_user = span
        else:
            layout.last_user_reason = span
    if need_reasoning and markers is not None and prompt_len is not None:
        block = reasoning_span(engine, ids[:prompt_len], ids[prompt_len:], markers)
        if block is None:
            layout.reasoning_reason = "no_reasoning_block"
        else:
            layout.reasoning = Span(prompt_len, prompt_len + block.end)
    return layout
