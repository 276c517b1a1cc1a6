"""Counting a request's hand-offs off the event loop (issue 37 asks for two): which threads its hooks ran
on, and which work the host's scheduler was handed."""

from __future__ import annotations

import threading
from typing import Any

from ..hookspecs import hookimpl


class Recorder:
    """A plugin object (``register=[Recorder()]``) that records which request-path hooks ran, in order, on
    which thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def _seen(self, name: str) -> None:
        self.calls.append((name, threading.current_thread().name))

    @hookimpl
    def validate_request(self, ctx):
        self._seen("validate_request")

    @hookimpl
    def before_tokenize(self, ctx):
        self._seen("before_tokenize")

    @hookimpl
    def after_tokenize(self, ctx):
        self._seen("after_tokenize")

    @hookimpl
    def before_forward(self, ctx):
        self._seen("before_forward")

    @hookimpl
    def after_generate(self, ctx):
        self._seen("after_generate")

    @hookimpl
    def render_headers(self, ctx):
        self._seen("render_headers")
        return {"X-Recorded": str(len(self.calls))}

    @hookimpl
    def response_extras(self, ctx):
        self._seen("response_extras")

    def threads_off_the_loop(self, loop: str = "millm-test-loop") -> list[str]:
        """The threads the hooks before the response ran on, one entry per change of thread, numbers cut
        (``asyncio_0`` is ``asyncio``): the hooks of one hop run on one thread."""
        threads, previous = [], loop
        for _, thread in self.calls:
            if thread not in (previous, loop):
                threads.append(thread.rstrip("0123456789_-"))
            previous = thread
        return threads


def count_dispatches(monkeypatch: Any, scheduler: Any) -> list[str]:
    """Every piece of work ``scheduler`` is handed from now on (to its text thread, its engine thread or a
    generation's own), by method name."""
    dispatched: list[str] = []
    for name in ("run", "run_text", "submit", "submit_beside"):
        original = getattr(scheduler, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            dispatched.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(scheduler, name, counted)
    return dispatched
