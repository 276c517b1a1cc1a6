"""Large request objects are freed on the graveyard's thread, a slice at a time, not on the event loop.

Freeing a list of 2M token ids cost 7-11 ms with the GIL held, on whichever thread
dropped it last: the event loop, for a request's body (issue 11 §0).
"""

from __future__ import annotations

import gc
import threading
import time

from millm_host.bodies import read, release as graveyard
from millm_host.bodies.validate import validate
from millm_host.errors import InvalidParameter
from millm_host.protocol import EmbeddingRequest


class Noted:
    """Notes the thread that frees it."""

    freed_on: list[str] = []

    def __del__(self) -> None:
        Noted.freed_on.append(threading.current_thread().name)


def settled(timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while graveyard.pending() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert graveyard.pending() == 0


def test_a_kept_list_is_freed_on_the_graveyards_thread_once_nobody_holds_it():
    Noted.freed_on = []
    items = [Noted() for _ in range(graveyard.LONG)]
    body = {"input": items}
    graveyard.keep(items)
    time.sleep(0.05)
    assert Noted.freed_on == [] and len(items) == graveyard.LONG  # still held: left alone
    del items, body
    settled()
    assert set(Noted.freed_on) == {"millm-graveyard"} and len(Noted.freed_on) == graveyard.LONG


def test_a_kept_dict_frees_its_long_lists_too():
    Noted.freed_on = []
    body = {"input": [Noted() for _ in range(graveyard.LONG)], "model": "m"}
    graveyard.keep(body)
    del body
    settled()
    assert set(Noted.freed_on) == {"millm-graveyard"}


def test_a_parsed_body_s_long_lists_are_kept_and_untracked():
    """A long list of scalars is out of the collector's sight (each pass walked its 2M items with the GIL
    held) and kept by the graveyard, from the parser and from sliced validation alike."""
    settled()
    raw = b'{"model":"m","input":[' + b"7," * 100_000 + b"7]}"
    body = read.parse_json_body(raw, 64)
    assert not gc.is_tracked(body["input"])
    params = validate(EmbeddingRequest, body)
    assert params.input == body["input"] and params.input is not body["input"]
    assert not gc.is_tracked(params.input)
    assert graveyard.pending() == 2
    del body, params
    settled()


def test_a_list_of_containers_is_kept_but_stays_tracked():
    settled()
    raw = b'{"x":[' + b"[1]," * 20_000 + b"[1]]}"
    body = read.parse_json_body(raw, 64)
    assert gc.is_tracked(body["x"]) and graveyard.pending() == 1
    del body
    settled()


def test_a_refused_body_carries_no_parser_exception():
    """The 400 is raised after the parser's exception is gone: its traceback held the text and what was
    parsed of it, alive as long as the 400 (freed on the event loop)."""
    raw = b'{"x":[' + b"[]," * 70_000 + b"[]]}"
    try:
        read.parse_json_body(raw, 64, 65_536)
    except InvalidParameter as exc:
        assert exc.__context__ is None and exc.__cause__ is None
    else:
        raise AssertionError("not refused")
