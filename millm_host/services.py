"""What plugins ask of the host's replica convergence and model registry, without reaching into either.

Plugins get these through ``millm_host.api``; the objects behind them (``host.convergence``,
``host.registry``) stay the host's own, free to change shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

from .host_view import host_of

Converger = Callable[[], Awaitable[list[str]]]


def add_converger(host: Any, name: str, converger: Converger) -> None:
    """Register a plugin's converger (at ``startup``): each pass it brings this process to the desired state in
    the database and returns why it still differs, one line each (event loop)."""
    host_of(host).convergence.add(name, converger)


def converge_soon(host: Any) -> None:
    """A local change to desired state: run a convergence pass soon (any thread)."""
    host_of(host).convergence.poke()


def replica_alone(host: Any) -> bool:
    """Whether no other replica or worker runs on this database (then a start clears what was armed)."""
    return bool(host_of(host).convergence.alone())


def admin_activity(host: Any, kind: str, reason: str, *, refuses: bool = False) -> AbstractContextManager[Any]:
    """``with admin_activity(host, "measuring", reason):`` reports admin work on the resident model in
    ``/api/health`` while the block runs (``ModelRegistry.activity``)."""
    return host_of(host).registry.activity(kind, reason, refuses=refuses)


__all__ = ["Converger", "add_converger", "admin_activity", "converge_soon", "replica_alone"]
