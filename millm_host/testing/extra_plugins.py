"""The test-only plugins under ``tests/plugins``: never installed, loaded by the tests that need them.

``requirements.txt`` installs only what serving needs. Tests name the test-only
plugins in ``MILLM_PLUGIN_MODULES`` and put their directories on ``PYTHONPATH``
(``with_test_plugins``), so a ``millm serve`` the tests start loads them as if
they were installed. Outside a source checkout there are none.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: Their plugin names; each lives in ``tests/plugins/<name>/millm_<name>``.
TEST_PLUGINS = ("detector_example", "fault_injection", "scripted_output")


def _root() -> Path:
    return Path(__file__).resolve().parents[2] / "tests" / "plugins"


def module_entries() -> list[str]:
    """``name=module`` entries of the test-only plugins present in this checkout."""
    root = _root()
    return [f"{name}=millm_{name}" for name in TEST_PLUGINS if (root / name / f"millm_{name}").is_dir()]


def with_test_plugins(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the test-only plugins added to ``PYTHONPATH`` and ``MILLM_PLUGIN_MODULES``."""
    root = _root()
    modules = module_entries()
    out = dict(env)
    if not modules:
        return out
    paths = [str(root / entry.split("=")[0]) for entry in modules]
    existing = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(existing + [p for p in paths if p not in existing])
    named = [m for m in out.get("MILLM_PLUGIN_MODULES", "").split(",") if m.strip()]
    out["MILLM_PLUGIN_MODULES"] = ",".join(named + [m for m in modules if m not in named])
    return out


def make_importable() -> None:
    """Put the test-only plugins on ``sys.path`` of this process (tests import their helpers)."""
    import sys

    root = _root()
    for entry in module_entries():
        path = str(root / entry.split("=")[0])
        if path not in sys.path:
            sys.path.append(path)


def in_process_environ() -> dict[str, str]:
    """For a plugin manager built in this process: the test-only plugins importable and named."""
    make_importable()
    return {"MILLM_PLUGIN_MODULES": ",".join(module_entries())}
