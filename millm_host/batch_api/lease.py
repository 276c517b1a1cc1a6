"""A batch's lease: one replica runs a batch at a time (several replicas, or gunicorn workers, on one database).

A runner claims a batch by writing itself as ``lease_owner`` until
``lease_expires_at``, and renews it while the batch runs. Another replica takes
a batch only when no one holds it or its lease expired (its runner crashed), so
a batch resumes after a crash, and never runs on two replicas at once. Blocking:
call from a worker thread.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from .tables import Batch

#: Statuses a batch is still being worked on in (resumed after a restart).
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")


def _free(now: float) -> Any:
    return sa.or_(Batch.lease_owner.is_(None), Batch.lease_expires_at < now)


def claim(db: Any, batch_id: str, owner: str, seconds: float) -> bool:
    """Take the batch's lease (free, expired, or already ours); whether we hold it now."""
    now = time.time()
    with db.engine.begin() as connection:
        taken = connection.execute(
            sa.update(Batch)
            .where(Batch.id == batch_id, Batch.status.in_(UNFINISHED), sa.or_(_free(now), Batch.lease_owner == owner))
            .values(lease_owner=owner, lease_expires_at=now + seconds)
        )
        return taken.rowcount == 1


def renew(db: Any, batch_id: str, owner: str, seconds: float) -> str | None:
    """Extend our lease; the batch's status, or None when the lease is no longer ours."""
    with db.engine.begin() as connection:
        connection.execute(
            sa.update(Batch)
            .where(Batch.id == batch_id, Batch.lease_owner == owner)
            .values(lease_expires_at=time.time() + seconds)
        )
        row = connection.execute(sa.select(Batch.status, Batch.lease_owner).where(Batch.id == batch_id)).first()
    return row.status if row is not None and row.lease_owner == owner else None


def release(db: Any, batch_id: str, owner: str) -> None:
    with db.engine.begin() as connection:
        connection.execute(
            sa.update(Batch)
            .where(Batch.id == batch_id, Batch.lease_owner == owner)
            .values(lease_owner=None, lease_expires_at=None)
        )


def claimable(db: Any) -> list[str]:
    """Unfinished batches no live runner holds."""
    with db.session() as session:
        query = sa.select(Batch.id).where(Batch.status.in_(UNFINISHED), _free(time.time())).order_by(Batch.created_at)
        return list(session.scalars(query))
