"""Migrations with several replicas: a lock they share, or `millm db upgrade` as its own step.

Each test runs on SQLite and, when ``MILLM_TEST_POSTGRES_URL`` is set (CI sets it), on a
fresh PostgreSQL database.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from millm_host.app import Host
from millm_host.db import MIGRATION_LOCK_KEY, Database, DatabaseBehind, script_heads
from millm_host.plugins import build_plugin_manager
from millm_host.settings import Settings
from millm_host.testing import AppServer

# Waits for a go file, so that both processes reach the migrations together, then upgrades.
UPGRADE_AT_GO = textwrap.dedent("""
    import os, sys, time
    from millm_host.cli import main
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.005)
    sys.exit(main(["db", "upgrade"]))
""")


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """The URL of a fresh, empty database of each kind (PostgreSQL skipped when not configured)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'millm.sqlite3'}"
    return request.getfixturevalue("postgres_database")


def _environ(tmp_path, url: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "MILLM_DATA_DIR": str(tmp_path / "data"), "MILLM_DATABASE_URL": url, **extra}


def _migrations(tmp_path, url: str) -> list[tuple[str, str]]:
    settings = Settings(environ={"MILLM_DATA_DIR": str(tmp_path / "data"), "MILLM_DATABASE_URL": url})
    host = Host(settings, build_plugin_manager(settings))
    host.db.dispose()
    return host.migrations()


def _versions(url: str, names: list[str]) -> dict[str, list[str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return {
                name: [
                    row[0] for row in connection.execute(sa.text(f'SELECT version_num FROM "alembic_version_{name}"'))
                ]
                for name in names
            }
    finally:
        engine.dispose()


def test_two_processes_upgrading_one_fresh_database_at_once_both_succeed(database, tmp_path):
    go = tmp_path / "go"
    env = _environ(tmp_path, database)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UPGRADE_AT_GO, str(go)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    go.touch()
    outputs = [proc.communicate(timeout=180)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(outputs)
    migrations = _migrations(tmp_path, database)
    assert {"batch", "probes", "steering", "rulesets"} <= {name for name, _ in migrations}
    # each plugin's version table holds its head once: migrated once, not twice
    expected = {name: sorted(script_heads(Path(path))) for name, path in migrations}
    assert {name: sorted(rows) for name, rows in _versions(database, list(expected)).items()} == expected


def test_serving_without_migrating_refuses_a_database_behind_head_until_db_upgrade(database, tmp_path):
    env = _environ(tmp_path, database, MILLM_DB_MIGRATE="false")
    served = subprocess.run(
        [sys.executable, "-m", "millm_host.cli", "serve", "--port", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert served.returncode == 4, served.stderr
    assert "not at the head" in served.stderr and "millm db upgrade" in served.stderr
    assert "Traceback" not in served.stderr
    if "postgresql" in database:
        assert "***@" in served.stderr  # the URL is shown without its password

    with pytest.raises(DatabaseBehind):  # the same refusal in-process (gunicorn's create_app)
        AppServer(tmp_path / "app", env={"MILLM_DATABASE_URL": database, "MILLM_DB_MIGRATE": "false"}).start()

    upgraded = subprocess.run(
        [sys.executable, "-m", "millm_host.cli", "db", "upgrade"], env=env, capture_output=True, text=True, timeout=180
    )
    assert upgraded.returncode == 0, upgraded.stderr
    assert "database at head" in upgraded.stdout
    with AppServer(tmp_path / "app", env={"MILLM_DATABASE_URL": database, "MILLM_DB_MIGRATE": "false"}) as app:
        assert app.health()["status"] == "ok"


def test_an_upgrade_waits_for_the_postgresql_migration_lock(postgres_database, tmp_path):
    """Deterministic: the upgrade is seen waiting on the advisory lock in pg_locks, then finishes once it is free."""
    url = postgres_database
    holder = sa.create_engine(url)
    try:
        migrations = _migrations(tmp_path, url)
        with holder.connect() as held:
            held.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            held.commit()
            db = Database(url)
            errors: list[BaseException] = []

            def upgrade() -> None:
                try:
                    db.upgrade(migrations)
                except BaseException as exc:  # reported by the test thread
                    errors.append(exc)

            thread = threading.Thread(target=upgrade)
            thread.start()
            waiting = sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            while not held.execute(waiting).scalar():
                assert thread.is_alive() and not errors, errors
                held.rollback()
                time.sleep(0.01)
            assert not db._at_head("batch", migrations[0][1])  # nothing migrated while the lock is held
            held.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
            held.commit()
        thread.join(120)
        assert not thread.is_alive() and not errors, errors
        assert not db.behind(migrations)
        db.dispose()
    finally:
        holder.dispose()
