"""Token ids to text, incrementally, with stop sequences enforced.

The same assembler serves streaming and non-streaming requests, so both give
the same text. A stop sequence is never sent, not even in part: text that could
be the start of one is held back until it cannot. With ``stops_after`` (vLLM's
``min_tokens``) stop sequences are looked for only from that many tokens on, in
the text that comes from then (text before is sent as it comes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextAssembler:
    """Turns generated ids into text deltas, watching for stop sequences."""

    def __init__(
        self, decode: Callable[[Sequence[int]], str], stops: Sequence[str] = (), *, stops_after: int = 0
    ) -> None:
        self._decode = decode
        self._stops = [s for s in stops if s]
        self._stops_after = stops_after
        self._floor = 0  # stop sequences are looked for in ``text[_floor:]``
        self._longest = max(map(len, self._stops), default=0)
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""  # all text decoded so far (before stop truncation)
        self._sent = 0  # characters of ``text`` handed out
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Add one token; return the text that may be sent now ("" if none)."""
        self._ids.append(token_id)
        window = self._ids[self._prefix_offset :]
        new_text = self._decode(window)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.text += new_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._release()

    def _release(self) -> str:
        if not self._stops or len(self._ids) < self._stops_after:
            delta, self._sent = self.text[self._sent :], len(self.text)
            self._floor = self._sent if self._stops else 0
            return delta
        search_from = max(self._floor, self._sent - self._longest + 1)
        hits = [i for i in (self.text.find(s, search_from) for s in self._stops) if i >= 0]
        if hits:
            cut = min(hits)
            self.text = self.text[:cut]
            self.stopped = True
            delta, self._sent = self.text[self._sent : cut], cut
            return delta
        safe = len(self.text) - self._held_back()
        if safe <= self._sent:
            return ""
        delta, self._sent = self.text[self._sent : safe], safe
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of ``text`` that begins some stop sequence."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self.text) - self._floor), best, -1):
                if self.text.endswith(stop[:n]):
                    best = n
                    break
        return best

    def finish(self) -> str:
        """The generation ended without a stop sequence: release what was held back."""
        if self.stopped:
            return ""
        delta, self._sent = self.text[self._sent :], len(self.text)
        return delta
