"""The database: one SQLAlchemy engine, and each plugin's own Alembic migrations.

SQLite in the data directory by default; any SQLAlchemy URL through
``MILLM_DATABASE_URL``. Every plugin migrates only its own tables, tracked in its
own version table (``alembic_version_<plugin>``), so installing or removing one
plugin never disturbs another's history.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from .settings import Settings

log = logging.getLogger("millm.db")

_ENV_DIR = Path(__file__).parent / "migrations"
#: The PostgreSQL advisory lock key replicas take while migrating ("millm" in ASCII).
MIGRATION_LOCK_KEY = 0x6D696C6C6D


def database_url(settings: Settings) -> str:
    url = settings["MILLM_DATABASE_URL"]
    if url:
        return url
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data_dir / 'millm.sqlite3'}"


class DatabaseBehind(RuntimeError):
    """``MILLM_DB_MIGRATE=false`` and the database is not at every plugin's head: ``millm db upgrade`` first."""


class Database:
    """The engine and a session factory for plugins."""

    def __init__(self, url: str) -> None:
        self.url = url
        kwargs = {}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        self.engine = sa.create_engine(url, **kwargs)
        if url.startswith("sqlite"):
            sa.event.listen(self.engine, "connect", _sqlite_pragmas)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def shown_url(self) -> str:
        """The URL without its password, for logs and messages."""
        return sa.make_url(self.url).render_as_string(hide_password=True)

    def check_at_head(self, migrations: list[tuple[str, str]]) -> None:
        """Raise ``DatabaseBehind`` unless every plugin's migrations are at head (serving without migrating)."""
        behind = self.behind(migrations)
        if behind:
            raise DatabaseBehind(
                f"the database {self.shown_url} is not at the head of the migrations of {', '.join(behind)}, "
                "and MILLM_DB_MIGRATE=false leaves migrating to another step: run `millm db upgrade` first"
            )

    def session(self) -> Session:
        return self.sessions()

    def upgrade(self, migrations: list[tuple[str, str]]) -> None:
        """Apply each plugin's migrations up to its head.

        A database already at every head is recognised without importing Alembic
        (a tenth of a second of every restart); anything else goes through Alembic,
        under a lock that replicas starting at once share (see ``migration_lock``):
        the first migrates, the others wait, then find the database at head.
        """
        if not self._pending(migrations):
            for name, _ in migrations:
                log.info("database: %s migrations at head", name)
            return
        from alembic import command

        with self.migration_lock():
            for name, versions in self._pending(migrations):  # again: another replica may have migrated
                with self.engine.begin() as connection:
                    cfg = _alembic_config(versions, name, connection)
                    command.upgrade(cfg, "heads")
                log.info("database: %s migrations applied", name)

    def behind(self, migrations: list[tuple[str, str]]) -> list[str]:
        """The names whose migrations are not at head, asked of Alembic when the quick check is unsure."""
        pending = self._pending(migrations)
        if not pending:
            return []
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        behind = []
        with self.engine.connect() as connection:
            for name, versions in pending:
                cfg = _alembic_config(versions, name, connection)
                heads = set(ScriptDirectory.from_config(cfg).get_heads())
                context = MigrationContext.configure(connection, opts={"version_table": f"alembic_version_{name}"})
                if set(context.get_current_heads()) != heads:
                    behind.append(name)
        return behind

    @contextlib.contextmanager
    def migration_lock(self) -> Iterator[None]:
        """Held while migrating, across processes: a PostgreSQL advisory lock on a fixed key, or,
        for a SQLite file, an exclusive ``flock`` on a file beside it (other databases: none)."""
        if self.engine.dialect.name == "postgresql":
            with self.engine.connect() as connection:
                connection.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
                connection.commit()  # the lock is the session's; no transaction stays open while others migrate
                try:
                    yield
                finally:
                    connection.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
                    connection.commit()
            return
        path = self.engine.url.database if self.engine.dialect.name == "sqlite" else None
        if not path or path == ":memory:":
            yield
            return
        with open(f"{path}.migrate-lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _pending(self, migrations: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(name, versions) for name, versions in migrations if not self._at_head(name, versions)]

    def _at_head(self, name: str, versions: str) -> bool:
        """Whether ``alembic_version_<name>`` holds exactly the heads of the scripts in ``versions``."""
        heads = script_heads(Path(versions))
        if not heads:
            return False
        table = f"alembic_version_{name}"
        try:
            with self.engine.connect() as connection:
                if not sa.inspect(connection).has_table(table):
                    return False
                stored = {row[0] for row in connection.execute(sa.text(f'SELECT version_num FROM "{table}"'))}
        except sa.exc.SQLAlchemyError:
            return False
        return stored == heads

    def dispose(self) -> None:
        self.engine.dispose()


def _alembic_config(versions: str, name: str, connection: sa.Connection) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_ENV_DIR))
    cfg.set_main_option("version_locations", str(versions))
    cfg.set_main_option("path_separator", "os")
    cfg.attributes["connection"] = connection
    cfg.attributes["version_table"] = f"alembic_version_{name}"
    return cfg


def script_heads(versions: Path) -> set[str]:
    """The head revisions of a folder of Alembic scripts, read without Alembic (empty: not sure)."""
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in versions.glob("*.py"):
        values = {}
        try:
            for node in ast.parse(script.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    if node.targets[0].id in ("revision", "down_revision"):
                        values[node.targets[0].id] = ast.literal_eval(node.value)
        except (OSError, SyntaxError, ValueError):
            return set()
        revision, down = values.get("revision"), values.get("down_revision")
        if not isinstance(revision, str):
            return set()
        revisions.add(revision)
        parents.update([down] if isinstance(down, str) else list(down or ()))
    return revisions - parents


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # WAL with NORMAL sync never corrupts the database; a commit just no longer waits for an
    # fsync (several ms on a busy disk), which request-path writes such as probe events cannot afford.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
