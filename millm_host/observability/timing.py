"""``Timing``: the instants of one request, marked where they happen (engine thread included).

Plain integers (``time.time_ns()``), so marking a token costs one call and one
append; metrics and spans are made from them once the request ends.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Timing:
    """When a request arrived, waited, started and produced its tokens (nanoseconds since the epoch)."""

    received: int = field(default_factory=time.time_ns)
    #: Handed to the engine thread; the engine thread began it.
    queued: int | None = None
    started: int | None = None
    first_token: int | None = None
    last_token: int | None = None
    #: Gaps between consecutive tokens of one sequence (ns): the inter-token latencies.
    gaps: list[int] = field(default_factory=list)
    _previous: int | None = None

    def queue(self) -> None:
        self.queued = time.time_ns()

    def start(self) -> None:
        self.started = time.time_ns()

    def sequence(self) -> None:
        """A new sequence begins: its first token is not a gap after the last one's."""
        self._previous = None

    def token(self) -> None:
        now = time.time_ns()
        if self.first_token is None:
            self.first_token = now
        if self._previous is not None:
            self.gaps.append(now - self._previous)
        self._previous = self.last_token = now
