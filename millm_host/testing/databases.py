"""Which database the test harness gives an app: SQLite in its data directory, or PostgreSQL.

``MILLM_TEST_POSTGRES_URL`` names a PostgreSQL role that may create databases
(``scripts/postgres-dev.sh`` prints it). With ``MILLM_TEST_DATABASE=postgresql`` (or
``pytest --database postgresql``) every ``AppServer`` and ``ServerProcess`` that is not
given ``MILLM_DATABASE_URL`` gets a PostgreSQL database of its own, one per data
directory, so a restart on the same data directory finds its state again, as it would
in SQLite. The databases made are dropped when the test session ends.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

import sqlalchemy as sa

#: A PostgreSQL URL (``postgresql+psycopg://user:password@host:port/database``) whose role has CREATEDB.
POSTGRES_URL = "MILLM_TEST_POSTGRES_URL"
#: ``sqlite`` (the default) or ``postgresql``: the database the harness gives each app.
BACKEND = "MILLM_TEST_DATABASE"
#: The reason a PostgreSQL test is skipped.
START = 'eval "$(scripts/postgres-dev.sh)"'
NO_POSTGRES = f"PostgreSQL not configured: set {POSTGRES_URL} ({START})"

_made: set[str] = set()


def postgres_url() -> str | None:
    return os.environ.get(POSTGRES_URL) or None


def backend() -> str:
    name = (os.environ.get(BACKEND) or "sqlite").strip().lower()
    if name not in ("sqlite", "postgresql"):
        raise ValueError(f"{BACKEND} must be sqlite or postgresql, not {name!r}")
    if name == "postgresql" and not postgres_url():
        raise RuntimeError(f"{BACKEND}=postgresql (--database postgresql) needs {POSTGRES_URL}: {START}")
    return name


def database_url(data_dir: Path | str) -> str:
    """The URL an app on ``data_dir`` uses under the current backend (tests read its tables with it)."""
    if backend() == "sqlite":
        return f"sqlite:///{Path(data_dir) / 'millm.sqlite3'}"
    digest = hashlib.sha1(str(Path(data_dir).resolve()).encode()).hexdigest()[:20]
    return create_database(f"millm_t_{digest}")


def database_environ(data_dir: Path | str) -> dict[str, str]:
    """``MILLM_DATABASE_URL`` for an app on ``data_dir``: nothing for SQLite (the data directory decides)."""
    return {} if backend() == "sqlite" else {"MILLM_DATABASE_URL": database_url(data_dir)}


def create_database(name: str | None = None) -> str:
    """A PostgreSQL database, its URL: a fresh uniquely named one by default; ``name`` is made empty the
    first time this process asks for it (one a crashed session left behind is dropped), then kept."""
    admin = postgres_url()
    if admin is None:
        raise RuntimeError(NO_POSTGRES)
    name = name or f"millm_t_{uuid.uuid4().hex[:20]}"
    if name not in _made:
        engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                connection.execute(sa.text(f'CREATE DATABASE "{name}"'))
        finally:
            engine.dispose()
        _made.add(name)
    return sa.make_url(admin).set(database=name).render_as_string(hide_password=False)


def drop_database(url: str) -> None:
    """Drop a database ``create_database`` made, closing any connection still open to it."""
    admin = postgres_url()
    name = sa.make_url(url).database
    if admin is None or not name:
        return
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()
    _made.discard(name)


def drop_made() -> None:
    """Drop every database this process made (at the end of the test session)."""
    admin = postgres_url()
    for name in sorted(_made):
        if admin:
            drop_database(sa.make_url(admin).set(database=name).render_as_string(hide_password=False))


def mark_storage(items: list, folder: Path, only: frozenset[str] | None = None) -> None:
    """Mark the collected tests under ``folder`` ``storage`` (``only``: just those files), from a plugin's
    ``conftest.py``, so that ``pytest -m storage --database postgresql`` runs them on PostgreSQL too."""
    import pytest

    if only is not None and (unknown := only - {path.name for path in folder.glob("test_*.py")}):
        # A renamed or misspelt file would silently drop its tests from the PostgreSQL pass.
        raise ValueError(f"mark_storage: no such test files in {folder}: {sorted(unknown)}")
    for item in items:
        if folder in Path(item.path).parents and (only is None or Path(item.path).name in only):
            item.add_marker(pytest.mark.storage)
