"""Refusals named in the terms of the body the client sent, for an API served as another (Responses, Messages)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import MillmError


@contextmanager
def named_as_sent(rename: Callable[[str | None], str | None]) -> Iterator[None]:
    """A ``MillmError`` raised inside names the sent body's field (``rename(param)``), not the chat body's it became."""
    try:
        yield
    except MillmError as exc:
        if exc.param is not None:
            renamed = rename(exc.param)
            if renamed != exc.param:  # the message names the chat field too: name the sent one
                exc.message = exc.message.replace(exc.param, renamed or "", 1)
                exc.args = (exc.message,)
            exc.param = renamed
        raise
