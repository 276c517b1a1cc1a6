"""Restarting on a migrated database: recognised at head without importing Alembic."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa

from millm_host.db import Database, script_heads
from millm_host.testing import databases

pytestmark = pytest.mark.storage

UPGRADE = textwrap.dedent("""
    import json, sys
    from millm_host.app import Host
    from millm_host.plugins import build_plugin_manager
    from millm_host.settings import Settings
    settings = Settings(environ={"MILLM_DATA_DIR": sys.argv[1], **json.loads(sys.argv[2])})
    host = Host(settings, build_plugin_manager(settings))
    host.db.upgrade(host.migrations())
    print(json.dumps({"alembic": "alembic" in sys.modules, "migrations": [n for n, _ in host.migrations()]}))
""")


def _upgrade(data_dir) -> dict:
    environ = json.dumps(databases.database_environ(data_dir))  # SQLite in data_dir, or its PostgreSQL database
    out = subprocess.run(
        [sys.executable, "-c", UPGRADE, str(data_dir), environ], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_restart_on_a_migrated_database_skips_alembic(tmp_path):
    first = _upgrade(tmp_path)
    assert first["alembic"] is True and {"probes", "steering"} <= set(first["migrations"])
    assert _upgrade(tmp_path)["alembic"] is False


def _script(folder, name, revision, down):
    (folder / f"{name}.py").write_text(f"revision = {revision!r}\ndown_revision = {down!r}\n")


def test_script_heads_follow_the_chain(tmp_path):
    _script(tmp_path, "a", "r1", None)
    _script(tmp_path, "b", "r2", "r1")
    _script(tmp_path, "c", "r3", "r1")
    assert script_heads(tmp_path) == {"r2", "r3"}
    _script(tmp_path, "d", "r4", ("r2", "r3"))  # a merge
    assert script_heads(tmp_path) == {"r4"}
    (tmp_path / "e.py").write_text("revision = compute()\n")  # unreadable: Alembic decides
    assert script_heads(tmp_path) == set()


def test_a_database_behind_or_without_its_version_table_is_not_at_head(tmp_path):
    versions = tmp_path / "versions"
    versions.mkdir()
    _script(versions, "a", "r1", None)
    _script(versions, "b", "r2", "r1")
    db = Database(databases.database_url(tmp_path))
    assert not db._at_head("demo", str(versions))
    with db.engine.begin() as connection:
        connection.execute(sa.text('CREATE TABLE "alembic_version_demo" (version_num VARCHAR(32) NOT NULL)'))
        connection.execute(sa.text("INSERT INTO alembic_version_demo VALUES ('r1')"))
    assert not db._at_head("demo", str(versions))
    with db.engine.begin() as connection:
        connection.execute(sa.text("UPDATE alembic_version_demo SET version_num = 'r2'"))
    assert db._at_head("demo", str(versions))
    db.dispose()
