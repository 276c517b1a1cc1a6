"""The import contracts (``[tool.importlinter]`` in pyproject.toml), checked with ``lint-imports``.

Plugins reach the host only through ``millm_host.api`` and ``millm_host.hookspecs``
and never import each other; the host imports no plugin, torch, transformers or
llama.cpp. The contracts are checked against this checkout (not whatever copy is
installed): every package directory of the repository goes first on PYTHONPATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def _pythonpath() -> str:
    dirs = [ROOT]
    for parent in ("plugins", "tests/plugins", "packages"):
        dirs += sorted(p for p in (ROOT / parent).glob("*") if p.is_dir() and (p / "pyproject.toml").is_file())
    return os.pathsep.join([*map(str, dirs), os.environ.get("PYTHONPATH", "")])


def _lint(*args: str, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    path = _pythonpath() if extra_path is None else os.pathsep.join([str(extra_path), _pythonpath()])
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
        timeout=300,
    )


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_every_import_contract_is_kept():
    result = _lint()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(_config()['contracts'])} kept, 0 broken." in result.stdout


def _ini(config: dict) -> str:
    """The same configuration as an ``.importlinter`` INI file."""

    def value(v: object) -> str:
        if isinstance(v, list):
            return "".join(f"\n    {item}" for item in v)
        return str(v).lower() if isinstance(v, bool) else str(v)

    lines = ["[importlinter]"]
    lines += [f"{k} = {value(v)}" for k, v in config.items() if k != "contracts"]
    for i, contract in enumerate(config["contracts"]):
        lines.append(f"\n[importlinter:contract:{i}]")
        lines += [f"{k} = {value(v)}" for k, v in contract.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("imported", "allowed"),
    [
        ("millm_host.errors", False),
        ("millm_host.resources.common", False),
        ("millm_steering.plugin", False),
        ("millm_host.api", True),
        ("millm_host.hookspecs", True),
    ],
)
def test_a_plugin_importing_a_host_module_breaks_the_contract(tmp_path, imported, allowed):
    """A new plugin held to the same contracts: only the public modules may be imported."""
    package = tmp_path / "millm_contract_example"
    package.mkdir()
    (package / "__init__.py").write_text(f"import {imported}\n")
    config = _config()
    config["root_packages"] = [*config["root_packages"], "millm_contract_example"]
    only_api, independent = config["contracts"][0], config["contracts"][1]
    only_api["source_modules"] = [*only_api["source_modules"], "millm_contract_example"]
    only_api["ignore_imports"] = [
        *only_api["ignore_imports"],
        "millm_contract_example -> millm_host.api",
        "millm_contract_example -> millm_host.hookspecs",
    ]
    independent["modules"] = [*independent["modules"], "millm_contract_example"]
    ini = tmp_path / "contracts.ini"
    ini.write_text(_ini(config))
    result = _lint("--config", str(ini), extra_path=tmp_path)
    if allowed:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"millm_contract_example -> {imported}" in result.stdout


def test_plugins_reach_the_host_only_through_its_plugin_view():
    """Hooks get a ``PluginHost`` (``host``, ``ctx.host``); nothing in a plugin unwraps it to the ``Host``."""
    import re
    from pathlib import Path

    from millm_host.host_view import HostView

    root = Path(__file__).resolve().parents[1] / "plugins"
    reaching = re.compile(r"\bhost\._host\b|\._host\b|\bhost_of\b|\bhost\.(registry|routes|convergence|scheduler|pm)\b")
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.glob("*/millm_*/**/*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if reaching.search(line)
    ]
    assert found == []
    assert HostView.__slots__ == ("_host",)  # a view holds nothing else a plugin could reach


def _host_import_graph() -> dict[str, set[str]]:
    """Each ``millm_host`` module and the host modules it imports, at run time or for typing alike."""
    import ast

    modules = {}
    for path in (ROOT / "millm_host").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                named = [f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in modules]
                # ``from . import a, b`` names modules: the package itself is not what is imported
                targets = named if len(named) == len(node.names) else [module, *named]
            else:
                continue
            graph[name] |= {target for target in targets if target in modules and target != name}
    return graph


def test_the_host_has_no_import_cycle_and_only_its_builders_name_the_app():
    """Host modules type what they use of the host with protocols of their own (``AdmissionHost``,
    ``ServingHost``, ...), never ``millm_host.app.Host``: only what builds the app imports it, and no
    chain of imports, ``TYPE_CHECKING`` ones included, leads back to where it started."""
    graph = _host_import_graph()
    assert sorted(name for name, imported in graph.items() if "millm_host.app" in imported) == [
        "millm_host.cli",
        "millm_host.testing.inprocess",
    ]
    done: set[str] = set()

    def walk(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("an import cycle: " + " -> ".join([*path[path.index(name) :], name]))
        if name in done:
            return
        for imported in sorted(graph[name]):
            walk(imported, [*path, name])
        done.add(name)

    for name in sorted(graph):
        walk(name, [])
