"""This replica's convergence to the desired state in the shared database.

Armed probes and steering are desired state: an operator changes them on one
replica, which writes them to the database; every replica runs its own gates
on its own model to reach them. Plugins register a converger (``add``): an
async function that reads the desired state, applies what it can here and
returns why this replica still differs (one line each, empty when it matches).

A pass runs every ``MILLM_CONVERGE_INTERVAL_S`` seconds, at once after a local
change (``poke``), and on demand when ``/api/health/ready`` finds the last pass
stale. Each pass writes this replica's heartbeat and report to ``millm_replicas``,
which also tells a starting replica whether it is alone (then what the last
process left armed is cleared, as a single server always did).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from .tables import Replica

if TYPE_CHECKING:
    from ..db import Database
    from ..settings import Settings


class ConvergenceHost(Protocol):
    """What convergence uses of the host."""

    settings: Settings
    db: Database

    def keep(self, task: asyncio.Task) -> None: ...


log = logging.getLogger("millm.replicas")

#: Why this replica differs from the desired state, one line per difference ("probe pr_1: parity failed here").
Converger = Callable[[], Awaitable[list[str]]]
#: A replica whose heartbeat is older than this many intervals (and at least ``MIN_TTL_S``) is gone.
TTL_INTERVALS = 3
MIN_TTL_S = 10.0


def replica_id(settings: Any) -> str:
    """``MILLM_REPLICA_ID``, or host:pid (``millm serve`` sets host:port:pid)."""
    return settings["MILLM_REPLICA_ID"] or f"{socket.gethostname()}:{os.getpid()}"


class Convergence:
    """The convergers, the background pass, and this replica's last report."""

    def __init__(self, host: ConvergenceHost) -> None:
        self.host = host
        self.db = host.db
        self.replica_id = replica_id(host.settings)
        self.interval = max(0.05, float(host.settings["MILLM_CONVERGE_INTERVAL_S"]))
        self.ttl = max(MIN_TTL_S, TTL_INTERVALS * self.interval)
        self.started_at = time.time()
        self.convergers: dict[str, Converger] = {}
        self.reasons: list[str] = []
        self.by_converger: dict[str, list[str]] = {}  # each converger's reasons at the last pass
        self.checked_at: float | None = None
        self.fresh = False  # a pass has run since the last local change or model load
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._pass: asyncio.Lock | None = None

    def add(self, name: str, converger: Converger) -> None:
        """Register a plugin's converger (at ``startup``); it runs on the event loop, each pass."""
        self.convergers[name] = converger

    # --- running passes ---------------------------------------------------------------------
    def poke(self) -> None:
        """Run a pass soon: something changed here (safe from any thread)."""
        self.fresh = False
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            loop.call_soon_threadsafe(wake.set)

    async def check(self) -> list[str]:
        """One pass over every converger; the reasons this replica differs (event loop)."""
        if self._pass is None:
            self._pass = asyncio.Lock()
        async with self._pass:
            self.fresh = True  # a poke during the pass makes it stale again
            reasons: list[str] = []
            by_converger: dict[str, list[str]] = {}
            for name, converger in list(self.convergers.items()):
                try:
                    by_converger[name] = list(await converger())
                except Exception as exc:  # one converger's failure is reported, never fatal
                    log.exception("converging %s failed", name)
                    by_converger[name] = [f"{name}: {type(exc).__name__}: {exc}"]
                reasons += by_converger[name]
            self.by_converger = by_converger
            if reasons != self.reasons:
                log.info("replica %s: %s", self.replica_id, "; ".join(reasons) or "converged")
            self.reasons, self.checked_at = reasons, time.time()
            await asyncio.to_thread(self.beat)
            return reasons

    async def current(self) -> list[str]:
        """The reasons, from a new pass when the last one is stale."""
        if not self.fresh:
            return await self.check()
        return self.reasons

    def start(self) -> None:
        """Start the background pass (event loop, when the server starts)."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="millm-converge")
        self.host.keep(self._task)

    async def stop(self) -> None:
        """Stop the pass and leave the replica table (a clean stop is gone at once, not after the TTL)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await asyncio.to_thread(self.leave)

    async def _run(self) -> None:
        assert self._wake is not None
        while True:  # the first pass at once: the heartbeat tells starting replicas this one runs
            self._wake.clear()
            try:
                await self.check()
            except Exception:  # the database may be away for a moment: try again next interval
                log.exception("replica %s: convergence pass failed", self.replica_id)
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except TimeoutError:
                pass

    # --- the replica table (blocking) -----------------------------------------------------------
    def beat(self) -> None:
        now = time.time()
        values = {"heartbeat_at": now, "converged": not self.reasons, "reasons": self.reasons}
        with self.db.engine.begin() as connection:
            updated = connection.execute(
                sa.update(Replica).where(Replica.replica_id == self.replica_id).values(**values)
            )
            if updated.rowcount == 0:
                connection.execute(
                    sa.insert(Replica).values(replica_id=self.replica_id, started_at=self.started_at, **values)
                )

    def leave(self) -> None:
        with self.db.engine.begin() as connection:
            connection.execute(sa.delete(Replica).where(Replica.replica_id == self.replica_id))

    def peers(self) -> list[Replica]:
        """Other replicas with a recent heartbeat.

        A row of this host and port with another pid is this replica's predecessor (killed before it
        could leave): no two live processes listen on one address, so it is not counted.
        """
        address = self.replica_id.rsplit(":", 1)[0] + ":" if self.replica_id.count(":") >= 2 else None
        with self.db.session() as session:
            rows = session.scalars(
                sa.select(Replica).where(
                    Replica.replica_id != self.replica_id, Replica.heartbeat_at > time.time() - self.ttl
                )
            )
            return [r for r in rows if address is None or not r.replica_id.startswith(address)]

    def alone(self) -> bool:
        """No other replica is running on this database (so desired state is this process's to clear)."""
        return not self.peers()

    def report(self) -> dict[str, Any]:
        """What ``/api/health`` says about convergence."""
        return {
            "id": self.replica_id,
            "converged": self.fresh and not self.reasons,
            "reasons": list(self.reasons) or ([] if self.fresh else ["not checked since the last change"]),
            "checked_at": self.checked_at,
            "interval_s": self.interval,
            # each plugin's part of the desired state (probes, rule sets, steering): converged here or why not
            "convergers": {
                name: {"converged": self.fresh and not reasons, "reasons": reasons}
                for name, reasons in self.by_converger.items()
            },
        }
