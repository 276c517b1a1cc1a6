"""The database: one SQLAlchemy engine, and each plugin's own Alembic migrations.

SQLite in the data directory by default; any SQLAlchemy URL through
``MILLM_DATABASE_URL``. Every plugin migrates only its own tables, tracked in its
own version table (``alembic_version_<plugin>``), so installing or removing one
plugin never disturbs another's history.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from .settings import Settings

log = logging.getLogger("millm.db")

_ENV_DIR = Path(__file__).parent / "migrations"


def database_url(settings: Settings) -> str:
    url = settings["MILLM_DATABASE_URL"]
    if url:
        return url
    data_dir = settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{data_dir / 'millm.sqlite3'}"


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

    def session(self) -> Session:
        return self.sessions()

    def upgrade(self, migrations: list[tuple[str, str]]) -> None:
        """Apply each plugin's migrations up to its head.

        A database already at every head is recognised without importing Alembic
        (a tenth of a second of every restart); anything else goes through Alembic.
        """
        pending = [(name, versions) for name, versions in migrations if not self._at_head(name, versions)]
        for name, versions in migrations:
            if (name, versions) not in pending:
                log.info("database: %s migrations at head", name)
        if not pending:
            return
        from alembic import command
        from alembic.config import Config

        for name, versions in pending:
            cfg = Config()
            cfg.set_main_option("script_location", str(_ENV_DIR))
            cfg.set_main_option("version_locations", str(versions))
            cfg.set_main_option("path_separator", "os")
            with self.engine.begin() as connection:
                cfg.attributes["connection"] = connection
                cfg.attributes["version_table"] = f"alembic_version_{name}"
                command.upgrade(cfg, "heads")
            log.info("database: %s migrations at head", name)

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
