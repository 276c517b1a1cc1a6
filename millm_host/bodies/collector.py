"""Holding off Python's cyclic garbage collector while objects are made by the million.

Left on, the collector runs a pass over the whole heap each time the heap grows by
a quarter, with the GIL held. Two moments make objects by the million:

- ``millm serve`` starting: torch, transformers and the plugins import about half a
  million long-lived objects, which cost eight full passes (1 to 2 s of CPU, a third
  of a warm start). ``hold_startup`` holds the collector from the command's first
  line; ``end_startup`` lets it go once the start model is loaded (or failed, or is
  not loaded on start). After every load the registry freezes what is alive
  (``freeze_survivors``), so the collector's full passes skip it from then on.
- the C JSON parser building a large request body (``paused``).

A long list of scalars (2M token ids) that a request holds is taken out of the
collector's sight (``untrack_plain``): every pass that looked at it walked its 2M
items with the GIL held, wherever the pass ran (the event loop, often).

Holds are counted: overlapping ones (a body parsed while the model loads) restore
the collector when the last ends, and only if it was on when the first began.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0
_was_enabled = False
_startup_held = False
#: CPython's own untracking (what it does for dicts of scalars); a no-op on an untracked object.
_gc_untrack = ctypes.pythonapi.PyObject_GC_UnTrack
_gc_untrack.argtypes = [ctypes.py_object]
_gc_untrack.restype = None


def untrack_plain(items: list) -> None:
    """Take ``items``, a list of scalars only (numbers, strings, booleans, None), out of the collector's sight.

    Such a list can be in no reference cycle, so the collector has nothing to find
    there; unseen, no pass walks its items. The caller vouches that it holds no
    container and will not be given one (a cycle through it would then never be
    collected: a leak, never a crash). Freeing it untracks it again, harmlessly.
    """
    _gc_untrack(items)


def hold() -> None:
    """Hold the collector off until the matching ``release``."""
    global _holders, _was_enabled
    with _lock:
        if _holders == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _holders += 1


def release() -> None:
    """End one ``hold``; the last one turns the collector back on if it was on before the first."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0 and _was_enabled:
            gc.enable()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """The collector held off for the ``with`` block."""
    hold()
    try:
        yield
    finally:
        release()


def hold_startup() -> None:
    """Hold the collector off while the server starts (``millm serve``)."""
    global _startup_held
    with _lock:
        if _startup_held:
            return
        _startup_held = True
    hold()


def end_startup() -> None:
    """End ``hold_startup``'s hold, once; a no-op when the server was started without it (tests)."""
    global _startup_held
    with _lock:
        if not _startup_held:
            return
        _startup_held = False
    release()


def freeze_survivors() -> None:
    """After a model load: freeze what is alive (it lives as long as the model), so full passes skip it.

    A load while the server runs collects first. The start-up's load does not: that collection
    would look at every object the start-up made (800,000 of them, 0.4 s before the server is
    ready) to free its import machinery's leftovers (13,000 objects, about 8 MB), which stay
    frozen instead (``gc.freeze``'s own advice for a process that has just imported everything).
    """
    with _lock:
        starting = _startup_held
    if not starting:
        gc.collect()
    gc.freeze()
