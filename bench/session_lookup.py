"""How long a continuation's session lookup takes with a store of 100,000 turns (target: under 2 ms).

Builds a SQLite store with the probes plugin's session tables (10,000 sessions of
10 turns, random keys), then times what ``validate_request`` does for a request
without ``X-miLLM-Session``: ``matching_sessions`` (the exact key, then the loose
one) and the matched session's ``last_active``. Hits, rewritten replies (loose
key only) and misses are timed apart; the script prints the median and p99.

    python bench/session_lookup.py [--turns 100000] [--lookups 2000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import sqlalchemy as sa

from millm_probes.sessions.tables import ProbeSession, ProbeSessionTurn
from millm_probes.sessions.turns import last_active, matching_sessions
from millm_probes.tables import Base


def populate(db, turns: int, per_session: int = 10) -> list[tuple[str, str]]:
    now = datetime.now(UTC)
    rng = random.Random(0)
    keys: list[tuple[str, str]] = []
    sessions, rows = [], []
    for s in range(turns // per_session):
        session_id = f"ses_{s:016x}"
        sessions.append(
            dict(
                id=session_id,
                source="new",
                ambiguous=False,
                turns=per_session,
                fired=0,
                started_at=now,
                last_active_at=now,
            )
        )
        for t in range(per_session):
            exact, loose = f"{rng.getrandbits(256):064x}", f"{rng.getrandbits(256):064x}"
            keys.append((exact, loose))
            rows.append(
                dict(
                    session_id=session_id,
                    turn=t + 1,
                    endpoint="chat.completions",
                    exact_key=exact,
                    loose_key=loose,
                    created_at=now,
                )
            )
    with db.engine.begin() as connection:
        connection.execute(sa.insert(ProbeSession), sessions)
        for i in range(0, len(rows), 10_000):
            connection.execute(sa.insert(ProbeSessionTurn), rows[i : i + 10_000])
    return keys


def timed(db, pairs: list[tuple[str, str]]) -> list[float]:
    out = []
    for exact, loose in pairs:
        started = time.perf_counter()
        found = matching_sessions(db, exact, loose)
        if len(found) == 1:
            last_active(db, found[0])
        out.append((time.perf_counter() - started) * 1000)
    return out


def report(name: str, ms: list[float]) -> None:
    ms = sorted(ms)
    print(f"{name:>16}: median {statistics.median(ms):.3f} ms, p99 {ms[int(len(ms) * 0.99) - 1]:.3f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--lookups", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = sa.create_engine(f"sqlite:///{Path(tmp) / 'sessions.sqlite3'}")
        Base.metadata.create_all(engine, tables=[ProbeSession.__table__, ProbeSessionTurn.__table__])
        db = SimpleNamespace(engine=engine)
        keys = populate(db, args.turns)
        rng = random.Random(1)
        sample = rng.sample(keys, args.lookups)
        timed(db, sample[:100])  # warm the connection pool and the page cache
        print(f"{args.turns} turns stored")
        report("continuation", timed(db, sample))
        report("rewritten reply", timed(db, [("0" * 64, loose) for _, loose in sample]))
        report("new conversation", timed(db, [(f"{i:064x}", f"{i:064x}") for i in range(args.lookups)]))


if __name__ == "__main__":
    main()
