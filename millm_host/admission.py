"""Admission: the one way work reaches the engine thread on a model.

Reserve a place in the queue (``503 queue_full`` past ``MILLM_QUEUE_MAX``), take
a lease on the model (loading it first if needed and allowed; ``503 model_busy``
during another model's load or any unload), run on the engine thread, release
both. Generation, scoring and embeddings go through it (``Serving.prepare``),
and so do plugins (``host.engine_slot(model)``): nothing copies the sequence.

A live request for the model that is serving takes the two in the other order
(``admit_leased``): the lease first (it cannot wait or load), then the queue place,
then validating and tokenizing in one hop.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .scheduler import BACKGROUND  # re-exported: the Batch API's runner sets it

if TYPE_CHECKING:
    from .engine import Engine
    from .registry import Lease, ModelEntry, ModelRegistry
    from .scheduler import Scheduler, Ticket


class AdmissionHost(Protocol):
    """What admission uses of the host (``millm_host.app.Host`` is one)."""

    registry: ModelRegistry
    scheduler: Scheduler


T = TypeVar("T")


@dataclass
class Admission:
    """A queue place and a lease on the model, held until ``release``."""

    scheduler: Scheduler
    ticket: Ticket
    lease: Lease | None = None

    @property
    def engine(self) -> Engine:
        """The resident model this admission holds a lease on."""
        assert self.lease is not None
        return self.lease.engine

    async def run(self, fn: Callable[..., T], *args: Any, cancel: threading.Event | None = None) -> T:
        """``fn(*args)`` on the engine thread, in queue order (skipped once ``cancel`` is set)."""
        return await self.scheduler.run(fn, *args, cancel=cancel)

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()
        self.ticket.release()


async def admit(host: AdmissionHost, entry: ModelEntry, cancel: threading.Event | None = None) -> Admission:
    """A queue place, then a lease on ``entry`` (made resident if it is not); the caller releases it.

    ``cancel`` (a request's ``cancel_event``): a wait for the model's load ends with
    ``RequestCancelled`` the moment it is set, its queue place freed.
    """
    host.registry.check_available(entry)  # model_busy wins over queue_full
    admission = Admission(host.scheduler, await queue_place(host.scheduler))
    try:
        admission.lease = await host.registry.acquire(entry, cancel)
    except BaseException:
        admission.release()
        raise
    return admission


async def admit_leased(host: AdmissionHost, lease: Lease) -> Admission:
    """The admission of a request that took its lease first (``ModelRegistry.lease_if_serving``): its
    queue place now (a refusal, ``queue_full``, releases the lease)."""
    try:
        return Admission(host.scheduler, await queue_place(host.scheduler), lease)
    except BaseException:
        lease.release()
        raise


async def queue_place(scheduler: Scheduler) -> Ticket:
    """A place in the queue: at once (or ``queue_full``) for a live request, after the live ones for
    background work (the Batch API's lines)."""
    return await scheduler.reserve_background() if BACKGROUND.get() else scheduler.reserve()


@asynccontextmanager
async def engine_slot(host: AdmissionHost, model: str) -> AsyncIterator[Admission]:
    """``async with host.engine_slot(model_id) as slot: await slot.run(fn, ...)``: admitted work.

    ``slot.engine`` is the resident model; the queue place and the lease are
    released when the block ends, whatever it raised.
    """
    admission = await admit(host, host.registry.resolve(model))
    try:
        yield admission
    finally:
        admission.release()
