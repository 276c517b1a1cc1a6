"""docs/deploy: the compose example parses, names only real settings, and runs real commands (no Docker needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from millm_host import cli
from millm_host.plugins import build_plugin_manager
from millm_host.settings import Settings

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def millm_services(compose: dict) -> dict[str, dict]:
    return {name: s for name, s in compose["services"].items() if s.get("command", [""])[0] == "millm"}


def resolved(value: str) -> str:
    """A compose value with ``${NAME:-default}`` / ``${NAME:?message}`` read as its default (or ``x``)."""
    return re.sub(r"\$\{[A-Z_]+(?::-([^}]*)|:\?[^}]*)?\}", lambda m: m.group(1) or "x", value)


def test_the_example_runs_postgres_a_migration_step_two_replicas_and_a_load_balancer(compose):
    services = millm_services(compose)
    replicas = [name for name, s in services.items() if s["command"][1] == "serve"]
    assert len(replicas) == 2 and services["migrate"]["command"] == ["millm", "db", "upgrade"]
    assert compose["services"]["postgres"]["image"].startswith("postgres:")
    for name in replicas:
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    nginx = (DEPLOY / (compose["services"]["lb"]["volumes"][0].split(":")[0])).read_text()
    upstreams = re.findall(r"server\s+([\w-]+):(\d+)", nginx)
    assert sorted(upstreams) == sorted((name, services[name]["command"][-1]) for name in replicas)


def test_every_environment_name_is_a_setting_and_every_value_reads(compose):
    settings = Settings()
    build_plugin_manager(settings)  # the installed plugins declare theirs
    declared = {setting.name for setting in settings.declared}
    for name, service in millm_services(compose).items():
        environ = {key: resolved(str(value)) for key, value in service["environment"].items()}
        assert set(environ) <= declared, (name, set(environ) - declared)
        read = Settings(environ=environ)
        build_plugin_manager(read)
        for key in environ:
            read[key]  # noqa: B018 - a value of the wrong type raises
        assert sa.make_url(read["MILLM_DATABASE_URL"]).drivername == "postgresql+psycopg"
        assert read["MILLM_DB_MIGRATE"] is (name == "migrate")  # only the migration step migrates


def test_each_command_is_one_the_cli_accepts(compose, monkeypatch):
    ran: list[tuple[str, dict]] = []
    monkeypatch.setattr(cli, "cmd_serve", lambda args: ran.append(("serve", vars(args))) or 0)
    monkeypatch.setattr(cli, "cmd_db", lambda args: ran.append(("db", vars(args))) or 0)
    for service in millm_services(compose).values():
        assert cli.main(service["command"][1:]) == 0
    serves = [args for command, args in ran if command == "serve"]
    assert len(serves) == 2 and all(args["host"] == "0.0.0.0" for args in serves)
    assert [args["db_command"] for command, args in ran if command == "db"] == ["upgrade"]
