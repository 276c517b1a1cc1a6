"""The tooling gates, configured in pyproject.toml: ruff (lint and format), and mypy on the host and the plugins."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check():
    result = run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_on_the_host_and_the_plugins():
    """mypy checks millm_host, every plugin and every shared package ([tool.mypy] files), and passes."""
    result = run("mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_covers_every_plugin_and_package():
    """A plugin or package added later is listed in [tool.mypy] files, not left unchecked."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["files"])
    packages = [*ROOT.glob("plugins/*/millm_*/__init__.py"), *ROOT.glob("packages/*/millm_*/__init__.py")]
    sources = {"millm_host", *(init.parent.relative_to(ROOT).as_posix() for init in packages)}
    assert len(sources) > 1 and sources <= listed, sorted(sources - listed)
