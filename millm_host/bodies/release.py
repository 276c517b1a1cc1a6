"""Large request objects freed on a thread of their own, a slice at a time, not on the event loop.

Freeing a list of 2M token ids costs 7-11 ms with the GIL held, in one C call, on
whichever thread drops the last reference: for a request body that is the event loop,
when the request ends (issue 11 §0). ``keep(obj)`` gives the graveyard a reference of
its own. Its thread looks every few ms and, once that reference is the only one left,
empties the object a slice at a time (``FREE_SLICE`` items a C call), so the interpreter
can hand the GIL to the event loop between slices.

Only plain data goes here (parsed JSON, validated lists): the graveyard never mutates
an object someone else still holds. One still held after ``GIVE_UP_S`` is let go as
it is (its last holder frees it); an object in a reference cycle is freed by the
collector, wherever it runs.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

#: Items one C call frees.
FREE_SLICE = 4096
#: Shorter lists and dicts are not worth a grave: their freeing is shorter than a slice.
LONG = FREE_SLICE
#: How often the graveyard's thread looks at what it keeps: at first, and after each ``keep``...
POLL_S = 0.005
#: ...doubling, while nothing is freed, up to this (a long request's objects are watched cheaply).
POLL_MAX_S = 0.1
#: An object someone else still holds after this long is let go as it is.
GIVE_UP_S = 600.0


class _Grave:
    __slots__ = ("obj", "until")

    def __init__(self, obj: Any, until: float) -> None:
        self.obj, self.until = obj, until


_lock = threading.Lock()
_graves: list[_Grave] = []
_freeing = 0  # taken from ``_graves`` and being emptied: still pending
_wake = threading.Event()
_thread: threading.Thread | None = None


def keep(obj: Any) -> None:
    """Free ``obj`` on the graveyard's thread once nothing else holds it (plain data only: see the module)."""
    global _thread
    with _lock:
        _graves.append(_Grave(obj, time.monotonic() + GIVE_UP_S))
        if _thread is None:
            _thread = threading.Thread(target=_run, name="millm-graveyard", daemon=True)
            _thread.start()
    _wake.set()


def keep_if_long(obj: Any) -> None:
    """``keep(obj)`` when ``obj`` is a list or dict of at least ``LONG`` items."""
    if isinstance(obj, (list, dict)) and len(obj) >= LONG:
        keep(obj)


def pending() -> int:
    """Objects kept and not yet freed (for tests)."""
    with _lock:
        return len(_graves) + _freeing


def keeps(obj: Any) -> bool:
    """Whether ``obj`` itself is kept, waiting to be freed (for tests)."""
    with _lock:
        return any(grave.obj is obj for grave in _graves)


def _run() -> None:
    wait: float | None = None  # nothing kept: until the next keep
    while True:
        woken = _wake.wait(wait)
        _wake.clear()
        freed, left = _sweep()
        if not left:
            wait = None
        elif woken or freed or wait is None:
            wait = POLL_S
        else:
            wait = min(2 * wait, POLL_MAX_S)


def _sweep() -> tuple[bool, bool]:
    """Free what only the graveyard holds; (whether anything was freed, whether anything is left to watch)."""
    global _freeing
    now = time.monotonic()
    with _lock:
        # 2: the grave's reference and getrefcount's own argument
        free = [g for g in _graves if sys.getrefcount(g.obj) <= 2 or g.until < now]
        if free:
            _graves[:] = [g for g in _graves if g not in free]
            _freeing += len(free)
        left = bool(_graves)
    for grave in free:
        obj, grave.obj = grave.obj, None
        try:
            if sys.getrefcount(obj) <= 2:  # this local and the argument: nobody else can see it emptied
                _empty(obj)
            del obj
        finally:
            with _lock:
                _freeing -= 1
    return bool(free), left


def _empty(obj: Any) -> None:
    """Empty a list or dict a slice at a time, descending into long ones only it holds."""
    if isinstance(obj, dict):
        while obj:
            _key, value = obj.popitem()
            if isinstance(value, (list, dict)) and len(value) >= LONG and sys.getrefcount(value) <= 2:
                _empty(value)
            del value
    elif isinstance(obj, list):
        while obj:
            time.sleep(0)  # the GIL to the event loop between slices, without its waiting to be handed it
            tail = obj[-FREE_SLICE:]
            del obj[-FREE_SLICE:]
            for i in range(len(tail)):
                item = tail[i]
                if isinstance(item, (list, dict)) and len(item) >= LONG and sys.getrefcount(item) <= 3:
                    _empty(item)  # held by tail, this local and the argument
                del item
            del tail
