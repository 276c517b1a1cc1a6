"""The GGUF-only install: the host plus engine_gguf, with neither torch nor transformers.

A fresh virtual environment gets exactly two distributions, built offline from
this checkout: millm-host and millm-engine-gguf. It sees the system's site
packages for their dependencies (llama-cpp-python, falcon, the default model's
wheel, ...), where torch and transformers are installed too, so a
``sitecustomize`` on the server's ``PYTHONPATH`` makes both unimportable: any
import of them, however indirect, fails the server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from millm_host.testing import ServerProcess

REPO = Path(__file__).resolve().parents[3]
DEFAULT_ID = "SmolLM2-135M-Instruct:Q4_1"

BLOCKER = '''\
"""Make torch and transformers unimportable, as in an install that lacks them."""
import importlib.abc
import sys

ABSENT = {"torch", "transformers"}


class _Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {name!r} (GGUF-only install)", name=name)
        return None


sys.meta_path.insert(0, _Absent())
'''


@pytest.fixture(scope="module")
def light_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A venv holding only millm-host and millm-engine-gguf, and the torch blocker."""
    root = tmp_path_factory.mktemp("gguf-only")
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "tests", "build")
    shutil.copytree(REPO / "millm_host", root / "src" / "host" / "millm_host", ignore=ignore)
    shutil.copy(REPO / "pyproject.toml", root / "src" / "host")
    shutil.copytree(REPO / "plugins" / "engine_gguf", root / "src" / "engine_gguf", ignore=ignore)
    venv.create(root / "venv", system_site_packages=True, with_pip=False)
    python = root / "venv" / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", str(root / "src" / "host"), str(root / "src" / "engine_gguf")],
        check=True, capture_output=True, timeout=300,
    )
    blocker = root / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    return {"root": root, "python": python, "blocker": blocker, "data": root / "data"}


def light_environ(env: dict[str, Path]) -> dict[str, str]:
    return {"PYTHONPATH": str(env["blocker"]), "GGUF_N_THREADS": "1", "GGUF_N_THREADS_BATCH": "1"}


def test_the_light_environment_has_no_torch_and_only_the_gguf_plugin(light_env, monkeypatch):
    monkeypatch.chdir(light_env["root"])  # not the checkout: its millm_host would shadow the installed one
    probe = subprocess.run(
        [str(light_env["python"]), "-c",
         "import importlib.metadata as m, millm_host, millm_engine_gguf\n"
         "print(sorted(e.name for e in m.entry_points(group='millm')))\n"
         "print(all('/venv/' in x.__file__ for x in (millm_host, millm_engine_gguf)))\n"
         "for name in ('torch', 'transformers'):\n"
         "    try:\n        __import__(name)\n    except ImportError:\n        print(name, 'absent')\n"],
        env={**os.environ, **light_environ(light_env)}, capture_output=True, text=True, check=True,
    )
    assert probe.stdout.splitlines() == ["['engine_gguf']", "True", "torch absent", "transformers absent"]
    plugins = subprocess.run(
        [str(light_env["python"]), "-m", "millm_host.cli", "plugins"],
        env={**os.environ, **light_environ(light_env)}, capture_output=True, text=True, check=True,
    )
    assert plugins.stdout.split()[:3] == ["engine_gguf", "0.1.0", "loaded"]


def test_serve_engine_gguf_answers_a_chat_without_torch(light_env, monkeypatch):
    monkeypatch.chdir(light_env["root"])
    server = ServerProcess(light_env["data"], python=str(light_env["python"]), env=light_environ(light_env),
                           args=["--engine", "gguf"])
    with server:
        health = server.http().get("/api/health").json()
        assert (health["model"], health["engine"], health["engines"]) == (DEFAULT_ID, "gguf", ["gguf"])
        assert health["failed_plugins"] == []
        client = server.openai()
        reply = client.chat.completions.create(
            model=DEFAULT_ID, messages=[{"role": "user", "content": "Say hello."}], temperature=0, max_tokens=16
        )
        assert reply.choices[0].message.content
        assert reply.usage.completion_tokens > 0
        streamed = client.chat.completions.create(
            model=DEFAULT_ID, messages=[{"role": "user", "content": "Say hello."}], temperature=0, max_tokens=16,
            stream=True,
        )
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == reply.choices[0].message.content
