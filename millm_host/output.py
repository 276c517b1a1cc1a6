"""What plugins add to a response: body extras and output text filters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# The order extras are merged in (ascending; a later one wins a shared key), into the body or a stream's finish chunk.
ORDER_PROBE_VERDICTS = 100
ORDER_SAE_ACTIVATIONS = 200
ORDER_STEERING = 300


@dataclass
class ResponseExtra:
    """Fields a plugin adds to a response body (or to a stream's last ``finish_reason`` chunk).

    With ``choice`` (a choice's index) the fields join that choice's object instead: in the
    body's ``choices``, or on a stream that choice's ``finish_reason`` chunk (e.g. the verdicts
    of each reply of ``with_unsteered``). A body without that choice leaves them out.
    """

    fields: dict[str, Any]
    order: int = 500
    choice: int | None = None


@dataclass
class FilterResult:
    """What an output filter makes of a finished sequence."""

    text: str = ""
    finish_reason: str | None = None  # replaces the sequence's finish_reason when set
    message_extras: dict[str, Any] = field(default_factory=dict)
    #: Extra delta fields to stream before the final chunk (e.g. ``{"tool_calls": [...]}``).
    stream_delta: dict[str, Any] | None = None


class OutputFilter(Protocol):
    """Rewrites one sequence's text as it is generated (e.g. parses tool calls)."""

    def feed(self, text: str) -> str:
        """Take newly generated text; return the part that may be sent now."""

    def finish(self, finish_reason: str) -> FilterResult:
        """The sequence ended: return the held-back text and any rewrite."""

    # Optional: ``take_deltas() -> list[dict]``, extra delta fields ready to stream now (after
    # ``feed`` and after ``finish``), e.g. a tool call's id and name, then its arguments as written.


@dataclass
class OutputFilterFactory:
    """``make(sequence_index)`` returns the ``OutputFilter`` for one sequence."""

    make: Callable[[int], OutputFilter]
    owner: str = ""
