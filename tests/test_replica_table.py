"""The replica table: who else runs on this database (a starting replica clears armed state only when alone)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import sqlalchemy as sa

from millm_host.app import REPLICA_MIGRATIONS
from millm_host.db import Database
from millm_host.replicas.convergence import Convergence
from millm_host.replicas.tables import Replica


def convergence(db: Database, replica_id: str) -> Convergence:
    settings = {"MILLM_REPLICA_ID": replica_id, "MILLM_CONVERGE_INTERVAL_S": 3.0}
    return Convergence(SimpleNamespace(db=db, settings=settings))  # type: ignore[arg-type]


def test_a_replica_sees_live_peers_but_not_its_killed_predecessor_or_a_stale_one(tmp_path):
    db = Database(f"sqlite:///{tmp_path / 'replicas.sqlite3'}")
    db.upgrade([("replicas", str(REPLICA_MIGRATIONS))])
    me = convergence(db, "host1:8000:200")
    assert me.alone()
    convergence(db, "host1:8001:150").beat()  # another port on this host: a peer
    assert [r.replica_id for r in me.peers()] == ["host1:8001:150"]
    convergence(db, "host1:8000:100").beat()  # this address, another pid: killed before it could leave
    assert [r.replica_id for r in me.peers()] == ["host1:8001:150"]
    with db.engine.begin() as connection:  # its heartbeat stopped long ago
        connection.execute(sa.update(Replica).values(heartbeat_at=time.time() - 3600))
    assert me.alone()
    me.beat()
    peer = convergence(db, "host2:8000:300")
    assert [r.replica_id for r in peer.peers()] == ["host1:8000:200"]
    me.leave()  # a clean stop leaves at once
    assert peer.alone()
    db.dispose()
