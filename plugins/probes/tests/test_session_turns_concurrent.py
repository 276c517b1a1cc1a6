"""Turns of one session written at once by several replicas (each its own ``Sessions``, as each process
has): every turn is stored, each with a number of its own (in-process, one shared SQLite file, or a
PostgreSQL database when ``MILLM_TEST_POSTGRES_URL`` is set)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import sqlalchemy as sa

from millm_host.db import Database
from millm_host.testing.replicas import shared_database_url
from millm_probes.sessions.tables import ProbeSession, ProbeSessionTurn
from millm_probes.sessions.turns import Claim, Sessions

VERSIONS = Path(__file__).parents[1] / "millm_probes" / "migrations" / "versions"


def test_turns_written_at_once_by_two_replicas_are_each_stored_once(tmp_path):
    url = shared_database_url(tmp_path)
    setup = Database(url)
    setup.upgrade([("probes", str(VERSIONS))])
    setup.dispose()
    replicas = [Sessions(Database(url)), Sessions(Database(url))]  # two processes: two engines, two locks
    writers, each = 8, 25
    start = threading.Barrier(writers)
    failures: list[BaseException] = []

    def write(replica: Sessions, w: int) -> None:
        start.wait()
        for i in range(each):
            ctx = SimpleNamespace(conversations=[], request_id=f"req-{w}-{i}", endpoint="chat.completions", outputs=[])
            try:
                replica.record(ctx, Claim("shared-session", "header"), None, 1)  # type: ignore[arg-type]
            except BaseException as exc:  # a lost turn
                failures.append(exc)

    threads = [threading.Thread(target=write, args=(replicas[w % 2], w)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with replicas[0].db.engine.connect() as connection:
        turns = sorted(connection.scalars(sa.select(ProbeSessionTurn.turn)))
        count, fired = connection.execute(sa.select(ProbeSession.turns, ProbeSession.fired)).one()
    assert turns == list(range(1, writers * each + 1))  # none lost, no number twice
    assert count == fired == writers * each
    for replica in replicas:
        replica.db.dispose()
