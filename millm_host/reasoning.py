"""Reasoning output: a thinking block split from the answer, by the text of its markers.

A model whose chat template thinks writes its reasoning first, between markers
(``<think>`` … ``</think>``), then the answer. The chat reply carries the block as
``message.reasoning_content`` (streamed as ``delta.reasoning_content``), as vLLM and
DeepSeek do; the Responses API as a ``reasoning`` output item. The split is made on
the text as it is decoded (``ReasoningSplitter``): a marker may come in several tokens,
so only as much text as could still become the awaited marker is held back.

Which models think (``MILLM_REASONING``): ``auto`` (the default) splits for a model
whose chat template source contains an opening marker of ``MARKERS``, with that pair;
``on`` splits for every model (the template's pair, else ``<think>``/``</think>``);
``off`` never splits. A model that does not think is served exactly as before.

The rules, the same for the reply and for the probes' ``reasoning`` and ``answer``
windows (``reasoning_span``): one block, at the start of the reply (whitespace before
its opening marker is dropped), or open from the prompt when the template opens it
(the rendered prompt ends with the opening marker: generation starts inside). The
block ends at its closing marker; whitespace after it is dropped. A reply that does
not begin with the opening marker is all answer; a block that never closes is all
reasoning. Markers the tokenizer counts as special tokens are not decoded, so not seen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: The thinking markers known, as (opening, closing) pairs; the first whose opening marker the chat
#: template holds is the model's.
MARKERS: tuple[tuple[str, str], ...] = (
    ("<think>", "</think>"),  # DeepSeek-R1, Qwen3, QwQ, Phi-4-reasoning, SmolLM3
    ("<thinking>", "</thinking>"),
    ("<|begin_of_thought|>", "<|end_of_thought|>"),  # OpenThinker, Bespoke-Stratos
    ("<seed:think>", "</seed:think>"),  # Seed-OSS
    ("\u25c1think\u25b7", "\u25c1/think\u25b7"),  # Kimi (◁think▷ … ◁/think▷)
)
DEFAULT_MARKERS = MARKERS[0]
MODES = ("auto", "on", "off")

#: Prompt tokens decoded to see whether the template opened the block (generation starts inside).
_PROMPT_TAIL = 32


@dataclass(frozen=True)
class Markers:
    """One model's thinking markers."""

    opening: str
    closing: str


@dataclass(frozen=True)
class ReasoningPlan:
    """A chat request's split: the model's markers, and per prompt whether the prompt opened the block."""

    markers: Markers
    inside: tuple[bool, ...]

    def splitter(self, prompt_index: int) -> ReasoningSplitter:
        return ReasoningSplitter(self.markers, inside=self.inside[prompt_index])


def template_markers(chat_template: str | None) -> Markers | None:
    """The first pair of ``MARKERS`` whose opening marker the template source holds; None if none does."""
    if not chat_template:
        return None
    for opening, closing in MARKERS:
        if opening in chat_template:
            return Markers(opening, closing)
    return None


def model_markers(mode: str, chat_template: str | None) -> Markers | None:
    """The markers a model's replies are split on under ``MILLM_REASONING`` (``mode``); None: no split."""
    if mode == "off":
        return None
    found = template_markers(chat_template)
    if found is None and mode == "on":
        return Markers(*DEFAULT_MARKERS)
    return found


def opens_in_prompt(decode: Callable[[Sequence[int]], str], prompt: Sequence[int], markers: Markers) -> bool:
    """Whether the prompt ends inside a block: its text ends with the opening marker (whitespace aside)."""
    if not prompt:
        return False
    return decode(list(prompt[-_PROMPT_TAIL:])).rstrip().endswith(markers.opening)


def _held(text: str, marker: str) -> int:
    """The length of the longest tail of ``text`` that begins ``marker`` (held back: it may become it)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ReasoningSplitter:
    """Splits one reply's text, as it comes, into reasoning and answer (see the module docstring).

    ``feed`` and ``finish`` return ``(reasoning, answer)`` text ready now. ``closed_at`` is the
    offset in the text fed just past the closing marker (None while the block is open or if none was),
    ``found`` whether the reply had a block.
    """

    BEFORE, INSIDE, ANSWER = "before", "inside", "answer"

    def __init__(self, markers: Markers, *, inside: bool = False) -> None:
        self.markers = markers
        self.state = self.INSIDE if inside else self.BEFORE
        self.found = inside
        self.closed_at: int | None = None
        self._pending = ""  # text fed and not yet decided
        self._fed = 0  # characters fed so far
        self._strip = inside  # whitespace at the start of the block's or answer's text is dropped

    def feed(self, text: str) -> tuple[str, str]:
        """Take newly decoded text; return the reasoning and the answer that may be sent now."""
        self._pending += text
        self._fed += len(text)
        return self._advance(final=False)

    def finish(self) -> tuple[str, str]:
        """The reply ended: release what was held back."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> tuple[str, str]:
        reasoning = answer = ""
        if self.state == self.BEFORE:
            start = self._pending.lstrip()
            opening = self.markers.opening
            if start.startswith(opening):
                self.state, self.found, self._strip = self.INSIDE, True, True
                self._pending = start[len(opening) :]
            elif not final and opening.startswith(start):  # whitespace, or the marker's start: wait
                return "", ""
            else:
                self.state = self.ANSWER
        if self.state == self.INSIDE:
            if self._strip:
                self._pending = self._pending.lstrip()
                self._strip = not self._pending
            closing = self.markers.closing
            at = self._pending.find(closing)
            if at < 0:  # hold back what may become the marker, and whitespace that may come before it
                cut = len(self._pending) - (0 if final else _held(self._pending, closing))
                while cut and self._pending[cut - 1].isspace():
                    cut -= 1
                reasoning, self._pending = self._pending[:cut], self._pending[cut:]
                return reasoning, ""
            reasoning = self._pending[:at].rstrip()
            self._pending = self._pending[at + len(closing) :]
            self.closed_at = self._fed - len(self._pending)
            self.state, self._strip = self.ANSWER, True
        if self.state == self.ANSWER:
            if self._strip:
                self._pending = self._pending.lstrip()
                self._strip = not self._pending
            answer, self._pending = self._pending, ""
        return reasoning, answer


def split_text(text: str, markers: Markers, *, inside: bool = False) -> tuple[str | None, str]:
    """A whole reply as (reasoning, answer); reasoning is None when the reply had no block."""
    splitter = ReasoningSplitter(markers, inside=inside)
    reasoning, answer = splitter.feed(text)
    more, rest = splitter.finish()
    return (reasoning + more if splitter.found else None), answer + rest


@dataclass(frozen=True)
class ReasoningSpan:
    """Where a reply's block lies among its generated tokens: ``[0, end)`` (``end`` past the token that
    completed the closing marker; all of them when it never closed). None in ``reasoning_span``: no block."""

    end: int
    closed: bool


def reasoning_span(
    engine: Any, prompt: Sequence[int], generated: Sequence[int], markers: Markers
) -> ReasoningSpan | None:
    """The block among ``generated`` (the reply's token ids after ``prompt``), or None if it has none.

    The token ending the block is the first whose decoded prefix holds the whole closing
    marker (a binary search over prefixes: a few decodes, not one per token).
    """
    inside = opens_in_prompt(engine.decode, prompt, markers)
    splitter = ReasoningSplitter(markers, inside=inside)
    splitter.feed(engine.decode(list(generated)))
    splitter.finish()
    if not splitter.found:
        return None
    if splitter.closed_at is None:
        return ReasoningSpan(len(generated), closed=False)
    low, high = 1, len(generated)
    while low < high:
        middle = (low + high) // 2
        probe = ReasoningSplitter(markers, inside=inside)
        probe.feed(engine.decode(list(generated[:middle])))
        if probe.closed_at is not None:
            high = middle
        else:
            low = middle + 1
    return ReasoningSpan(low, closed=True)
