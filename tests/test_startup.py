"""Starting a server: the port first, loud warnings, health while loading, test-only plugins kept out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx

from millm_host.plugins import build_plugin_manager
from millm_host.settings import Settings
from millm_host.testing import shared_cache_dir
from millm_host.testing.extra_plugins import TEST_PLUGINS

REPO = Path(__file__).resolve().parents[1]


def test_a_busy_port_fails_before_loading_anything(tiny_server, tiny_model_dir, tmp_path):
    env = {**os.environ, "MILLM_DATA_DIR": str(tmp_path), "MILLM_CACHE_DIR": str(shared_cache_dir() / "model-cache")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "millm_host.cli",
            "serve",
            "--port",
            str(tiny_server.port),
            "--model",
            str(tiny_model_dir),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{tiny_server.port}" in output
    assert "loading model" not in output and "serving on" not in output and "migrations" not in output
    assert httpx.get(f"{tiny_server.base_url}/api/health").json()["status"] == "ok"  # the first one is unharmed


def test_health_names_the_model_while_it_loads(server_factory, tiny_model_dir):
    server = server_factory(tiny_model_dir, env={"FAULT_INJECTION_LOAD_DELAY_S": "3"}, wait_for="loading")
    with server.http() as http:
        loading = http.get("/api/health").json()
    assert loading["status"] == loading["phase"] == "loading"
    assert loading["model"] and loading["engine"] == "transformers"
    assert loading["progress"]  # the engine's last progress message
    ready = _wait_ok(server)
    assert (ready["status"], ready["phase"], ready["model"]) == ("ok", "loaded", loading["model"])
    assert ready["progress"] is None


def _wait_ok(server, timeout: float = 120) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = httpx.get(f"{server.base_url}/api/health", timeout=5).json()
        if health["status"] == "ok":
            return health
        time.sleep(0.2)
    raise TimeoutError(server.log())


def test_a_non_loopback_bind_without_keys_warns_loudly(server_factory):
    server = server_factory(args=["--host", "0.0.0.0"], env={"MILLM_LOAD_ON_START": "false"}, wait_for="no_model")
    log = server.log()
    assert "WITHOUT API KEYS" in log and "MILLM_ALLOWED_HOSTS is not set" in log
    keyed = server_factory(
        args=["--host", "0.0.0.0"],
        wait_for="no_model",
        env={"MILLM_LOAD_ON_START": "false", "MILLM_API_KEYS": "k", "MILLM_ALLOWED_HOSTS": "*"},
    )
    assert "WITHOUT API KEYS" not in keyed.log() and "!!!" not in keyed.log()


def test_a_loopback_bind_does_not_warn(tiny_server):
    assert "!!!" not in tiny_server.log()


#: Libraries only some requests need, which every restart paid for when plugins imported them at the
#: top: httpx (the web UI's pages call the API through it), jsonschema (``response_format``).
ON_FIRST_USE = ("httpx", "jsonschema")

BUILD = textwrap.dedent("""
    import json, sys
    from millm_host.app import build
    from millm_host.settings import Settings
    build(Settings(environ={"MILLM_DATA_DIR": sys.argv[1], "MILLM_LOAD_ON_START": "false"}))
    print(json.dumps(sorted(name for name in sys.modules if "." not in name)))
""")


def test_a_restart_imports_no_library_that_only_some_requests_need(tmp_path):
    def imported() -> set[str]:
        result = subprocess.run([sys.executable, "-c", BUILD, str(tmp_path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return set(json.loads(result.stdout.strip().splitlines()[-1]))

    imported()  # the first start migrates the database
    assert not imported() & {*ON_FIRST_USE, "alembic"}


# --- test-only plugins ---------------------------------------------------------------------------


def test_the_setup_does_not_install_test_only_plugins():
    lines = [line.split("#")[0].strip() for line in (REPO / "requirements.in").read_text().splitlines()]
    assert not [line for line in lines if "tests/plugins" in line]
    for name in TEST_PLUGINS:
        assert (REPO / "tests" / "plugins" / name / f"millm_{name}").is_dir()


def test_plugin_modules_register_modules_that_are_not_installed(tmp_path, monkeypatch):
    (tmp_path / "millm_listed_only.py").write_text(
        textwrap.dedent("""
        from millm_host.hookspecs import hookimpl
        from millm_host.settings import Setting

        __version__ = "2.5"

        @hookimpl
        def register_settings(register):
            register(Setting("LISTED_ONLY_FLAG", bool, False, "a setting of a plugin named in MILLM_PLUGIN_MODULES"))
    """)
    )
    (tmp_path / "millm_broken_listed.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    settings = Settings(environ={"MILLM_PLUGIN_MODULES": "listed=millm_listed_only, millm_broken_listed, absent=nope"})
    records = {r.name: r for r in build_plugin_manager(settings).millm_report.records}
    assert (records["listed"].status, records["listed"].version) == ("loaded", "2.5")
    assert "LISTED_ONLY_FLAG" in settings
    broken = records["millm_broken_listed"]
    assert broken.status == "failed" and "broken on purpose" in broken.error
    assert records["absent"].status == "failed"
    disabled = Settings(environ={"MILLM_PLUGIN_MODULES": "listed=millm_listed_only", "MILLM_DISABLE_PLUGINS": "listed"})
    assert {r.name: r.status for r in build_plugin_manager(disabled).millm_report.records}["listed"] == "disabled"
