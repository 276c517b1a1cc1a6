"""Several ``millm serve`` replicas on one database, for tests and benches.

``shared_database_url`` gives a fresh database both replicas use: a new database on
the PostgreSQL server of ``MILLM_TEST_POSTGRES_URL`` when that is set, else a SQLite
file (one machine). ``wait_until`` polls a condition (replicas converge in the background).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

#: A short pass, so tests wait for convergence in tenths of a second rather than seconds.
FAST_CONVERGE = {"MILLM_CONVERGE_INTERVAL_S": "0.3"}


def shared_database_url(directory: Path, postgres_url: str | None = None) -> str:
    """A fresh, empty database for several replicas (PostgreSQL when a server URL is given or set)."""
    base = postgres_url or os.environ.get("MILLM_TEST_POSTGRES_URL")
    if not base:
        return f"sqlite:///{Path(directory) / 'shared.sqlite3'}"
    import sqlalchemy as sa

    name = "millm_replicas_" + secrets.token_hex(4)
    engine = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return sa.engine.make_url(base).set(database=name).render_as_string(hide_password=False)


def wait_until(condition: Callable[[], T], what: str, timeout: float = 120, interval: float = 0.1) -> T:
    """``condition()``'s first truthy value, polled every ``interval`` s; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)
    return found
