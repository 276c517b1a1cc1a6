"""A batch's lease (``millm_host.batch_api.lease``): one holder at a time, taken over only once it expires."""

from __future__ import annotations

import sqlalchemy as sa

from millm_host.app import BATCH_MIGRATIONS
from millm_host.batch_api import lease
from millm_host.batch_api.tables import Batch
from millm_host.db import Database


def database(tmp_path) -> Database:
    db = Database(f"sqlite:///{tmp_path / 'lease.sqlite3'}")
    db.upgrade([("batch", str(BATCH_MIGRATIONS))])
    with db.engine.begin() as connection:
        for batch_id, status in (("batch_run", "in_progress"), ("batch_done", "completed")):
            connection.execute(
                sa.insert(Batch).values(
                    id=batch_id,
                    endpoint="/v1/chat/completions",
                    input_file_id="file_x",
                    completion_window="24h",
                    status=status,
                    total=1,
                    completed=0,
                    failed=0,
                    created_at=0,
                    expires_at=2**31 - 1,
                )
            )
    return db


def test_one_holder_at_a_time_and_a_takeover_only_after_expiry(tmp_path):
    db = database(tmp_path)
    assert lease.claimable(db) == ["batch_run"]  # a finished batch is never taken
    assert lease.claim(db, "batch_run", "a", 30)
    assert not lease.claim(db, "batch_run", "b", 30)  # held
    assert lease.claimable(db) == []
    assert lease.claim(db, "batch_run", "a", 30)  # its holder may claim again (a restart under the same id)
    assert lease.renew(db, "batch_run", "a", 30) == "in_progress"
    assert lease.renew(db, "batch_run", "b", 30) is None  # not b's

    assert lease.claim(db, "batch_run", "a", -1)  # a's lease lapses (a crashed: no renewal)
    assert lease.claimable(db) == ["batch_run"]
    assert lease.claim(db, "batch_run", "b", 30)
    assert lease.renew(db, "batch_run", "a", 30) is None  # a hears it lost the batch, and stops
    lease.release(db, "batch_run", "a")  # a's release leaves b's lease alone
    assert not lease.claim(db, "batch_run", "a", 30)
    lease.release(db, "batch_run", "b")
    assert lease.claimable(db) == ["batch_run"]  # a clean stop frees it at once
    assert not lease.claim(db, "batch_done", "a", 30)
    db.dispose()
