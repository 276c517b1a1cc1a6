"""Plugin loading: listing, disabling, a broken plugin, a third-party detector, no torch in the host.

One ``millm plugins`` and the no-torch check run in subprocesses; the other CLI checks
call ``millm_host.cli.main`` in-process, and the app runs in-process on the echo engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from millm_host.cli import main
from millm_host.testing import chat, chat_body, stream_post
from millm_host.testing.extra_plugins import in_process_environ, with_test_plugins


def _millm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "millm_host.cli", *args],
        capture_output=True,
        text=True,
        env=with_test_plugins({**os.environ, **(env or {})}),
        timeout=120,
    )


def test_millm_plugins_lists_names_versions_and_status():
    out = _millm("plugins").stdout
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert rows["engine_transformers"][:2] == ["0.1.0", "loaded"]
    assert rows["detector_example"][:2] == ["0.1.0", "loaded"]


@pytest.fixture
def test_plugins_named(monkeypatch):
    """The test-only plugins (not installed) named for a plugin manager built in this process."""
    for name, value in in_process_environ().items():
        monkeypatch.setenv(name, value)


def cli(capsys, *args: str) -> str:
    """``millm *args`` in this process; its standard output."""
    assert main(list(args)) == 0
    return capsys.readouterr().out


def test_disabled_plugin_is_not_loaded(capsys, monkeypatch, test_plugins_named):
    monkeypatch.setenv("MILLM_DISABLE_PLUGINS", "detector_example")
    out = cli(capsys, "plugins")
    assert "detector_example" in out and "disabled" in out.split("detector_example")[1].splitlines()[0]


def test_millm_settings_lists_declared_settings(capsys, test_plugins_named):
    out = cli(capsys, "settings")
    assert "MILLM_QUEUE_MAX=" in out and "DETECTOR_EXAMPLE_ENABLED=" in out


@pytest.fixture(scope="module")
def broken_plugin_path(tmp_path_factory) -> Path:
    """A distribution whose entry point raises on import (found through sys.path)."""
    root = tmp_path_factory.mktemp("broken-plugin")
    dist = root / "millm_broken_example-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: millm-broken-example\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[millm]\nbroken_example = millm_broken_example\n")
    (root / "millm_broken_example.py").write_text("raise RuntimeError('this plugin is broken on purpose')\n")
    return root


def test_broken_plugin_is_reported_not_fatal(app_factory, broken_plugin_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(broken_plugin_path))  # where entry points are found
    out = cli(capsys, "plugins")
    assert "broken_example" in out and "failed" in out and "broken on purpose" in out
    app = app_factory(plugins="all")
    with app.http() as http:
        health = http.get("/api/health").json()
        reply = chat(http, health["model"], max_tokens=2)
    assert [p["name"] for p in health["failed_plugins"]] == ["broken_example"]
    assert "broken on purpose" in health["failed_plugins"][0]["error"]
    assert reply.status_code == 200


@pytest.fixture(scope="module")
def detector_app(app_factory):
    return app_factory(plugins=["detector_example"], env={"DETECTOR_EXAMPLE_ENABLED": "true"})


def test_third_party_detector_adds_header_and_body_field(detector_app):
    client = detector_app.openai()
    raw = client.chat.completions.with_raw_response.create(
        model=detector_app.model_id, messages=[{"role": "user", "content": "HELLO there"}], max_tokens=8, n=2, seed=1
    )
    reply = raw.parse()
    scores = reply.model_extra["detector_example"]["shouting"]
    assert scores == [0.7143, 0.7143]  # the echo engine answers "HELLO th": 5 capitals of 7 letters
    assert raw.headers["x-detector-shouting"] == ",".join(f"{s:.4f}" for s in scores)


def test_third_party_detector_extras_ride_on_the_finish_chunk(detector_app):
    with detector_app.http() as http:
        _, events = stream_post(
            http, "/v1/chat/completions", chat_body(detector_app.model_id, max_tokens=4, stream=True)
        )
    extra = events[-2]
    assert extra["choices"][0]["finish_reason"] == "length" and "shouting" in extra["detector_example"]


def test_detector_is_silent_unless_enabled(app_factory):
    app = app_factory(plugins=["detector_example"])
    with app.http() as http:
        response = chat(http, app.model_id, max_tokens=2)
    assert response.status_code == 200
    assert "detector_example" not in response.json() and "x-detector-shouting" not in response.headers


BLOCK_TORCH = textwrap.dedent("""
    import importlib.abc, sys

    class _Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers"):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, _Blocker())
""")


def test_host_builds_without_torch(tmp_path):
    script = BLOCK_TORCH + textwrap.dedent(f"""
        import json, sys
        from millm_host.app import build
        from millm_host.settings import Settings
        app, host = build(Settings(environ={{"MILLM_DATA_DIR": {str(tmp_path)!r}}}))
        print(json.dumps({{
            "torch": "torch" in sys.modules,
            "transformers": "transformers" in sys.modules,
            "engines": [e.name for e in host.engines],
            "failed": [r.name for r in host.report.failed],
        }}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["torch"] is False and facts["transformers"] is False
    # Discovering the transformers engine imports nothing heavy.
    assert "transformers" in facts["engines"]
