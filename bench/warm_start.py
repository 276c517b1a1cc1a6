"""Warm start: from ``millm serve`` to a ready model, its conversion already cached.

The candidate is ``millm serve`` on the default model (transformers engine,
float32 CPU) restarted on one data directory (its database already migrated, as
on every restart), with the installed plugins a user has (not the test-only
ones), polled on ``/api/health/ready`` every 20 ms until it answers 200. Baselines, measured in
the same rounds:

- a bare ``python`` that imports torch and transformers and loads the same
  cached checkpoint (``AutoTokenizer`` + ``from_pretrained``): what loading it
  the usual way costs, with no server at all;
- with ``--old REF``, ``millm serve`` from the source tree at git ``REF`` (for
  example the commit before a change), run the same way.

Each round runs every process once, in turn, so background load hits them
alike; figures are medians of ``--runs`` rounds, and the ratios are medians of
each round's own ratio. CPU seconds (user + system, up to ready) are printed
beside wall seconds: on a shared machine they move far less with other people's
load. After ready, one greedy completion of one token is timed, then a second:
work moved from the start to the first request would show there.

Python writes its bytecode cache as it does for a user (``PYTHONDONTWRITEBYTECODE``
is dropped from the children's environment; ``--as-is`` keeps it), and one
untimed run of each process fills it.

Then the start is broken down, in one process that takes ``millm serve``'s steps
in its order (the garbage collector held as it holds it), phase by phase (wall
and CPU, and the seconds the collector ran in each; medians of ``--phase-runs``
rounds, each tree's process in turn, so ``--old`` is broken down beside it), with
subtotals for the libraries' own imports (torch, transformers and the model's
modeling: what no server on this engine can avoid) and for the rest; once more with the
collector on throughout, as before the hold, for comparison; and once under
``python -X importtime``, whose self times are summed by package (the profiler
inflates them; compare them with each other).

    python bench/warm_start.py [--runs 5] [--old REF] [--as-is] [--phase-runs 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

from millm_host.default_model import default_model_path
from millm_host.testing import shared_cache_dir

REPO = Path(__file__).resolve().parents[1]
CACHE = shared_cache_dir() / "model-cache"

BASELINE = """
import sys
import torch, transformers
folder = sys.argv[1]
transformers.AutoTokenizer.from_pretrained(folder)
transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
"""

# millm serve's steps (millm_host.cli.cmd_serve, app.build, the lifespan's start-model load), in order.
PHASES = r"""
import gc, json, sys, time
spawned, cache_dir, data_dir, hold = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "held"
marks = [("interpreter start-up (to the first line)", time.time() - spawned, time.process_time(), 0.0)]
last = [time.perf_counter(), time.process_time()]
collecting = [0.0, 0.0]
def collector(phase, info):
    if phase == "start":
        collecting[1] = time.perf_counter()
    else:
        collecting[0] += time.perf_counter() - collecting[1]
gc.callbacks.append(collector)
def mark(name):
    now, cpu = time.perf_counter(), time.process_time()
    marks.append((name, now - last[0], cpu - last[1], collecting[0]))
    last[0], last[1], collecting[0] = now, cpu, 0.0
from millm_host import cli
mark("import millm_host.cli (plugins, settings)")
if hold:
    from millm_host.bodies import collector as gcpause
    gcpause.hold_startup()
import uvicorn
from millm_host.access import Access
from millm_host.app import Host
from millm_host.db import DatabaseBehind
mark("import the host (uvicorn, falcon, sqlalchemy, pydantic, serving)")
from millm_host import hookcalls
from millm_host.plugins import build_plugin_manager
from millm_host.settings import Settings
settings = Settings(environ={"MILLM_DATA_DIR": data_dir, "MILLM_CACHE_DIR": cache_dir})
pm = build_plugin_manager(settings)
mark("plugins: import, register, settings")
host = Host(settings, pm)
mark("host: fields, engines, metrics, database engine")
host.db.upgrade(host.migrations())
mark("migrations (a database at head: a version check)")
host.registry.discover()
hookcalls.startup(pm, "startup", host=host)
mark("model discovery and the plugins' startup")
import falcon.asgi
from millm_host import routes
app = falcon.asgi.App(middleware=[Access(settings, "127.0.0.1")])
routes.install(app, host)
mark("routes")
import torch
mark("library: import torch")
import transformers
mark("library: import transformers")
from millm_host.engine import resolve
entry = host.registry.start_model
resolve(entry.spec.factory)
mark("engine: import the engine plugin (jinja2, safetensors, ...)")
from millm_engine_transformers.loader import checkpoint_dir
folder = checkpoint_dir(entry.descriptor, settings.cache_dir, lambda message: None)
config = transformers.AutoConfig.from_pretrained(folder)
transformers.AutoModelForCausalLM._model_mapping[type(config)]
mark(f"library: import {config.model_type}'s modeling (torch.distributed, _dynamo, scipy, accelerate)")
engine = entry.spec.load(entry.descriptor, settings, lambda message: mark(f"load, until {message[:32]!r}"))
mark("load: weights, then the engine (its tokenizer copy, layers)")
hookcalls.lifecycle(pm, "model_loaded", host=host, engine=engine)
mark("model_loaded hooks")
if hold:
    gcpause.freeze_survivors()  # the registry's, after the start-up's load: a freeze
else:
    gc.collect()  # as it was before the hold: collect, then freeze
    gc.freeze()
mark("after the load: the registry's freeze (collector on: collect first)")
print("PHASES " + json.dumps(marks))
"""


def checkpoint_folder() -> Path:
    from millm_engine_transformers.loader import gguf_cache_dir

    return gguf_cache_dir(CACHE, default_model_path())


def source_path(root: Path) -> str:
    """PYTHONPATH for a source tree: its host, plugins and packages (as /work/tools/wtenv.sh sets it)."""
    paths = [root] + sorted(p for d in ("plugins", "packages") for p in (root / d).glob("*") if p.is_dir())
    return os.pathsep.join(str(p) for p in paths)


def tree_at(ref: str, into: Path) -> Path:
    """The repository's files at ``ref``, extracted into ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def environ(root: Path, data_dir: Path, as_is: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLM_")}
    if not as_is:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        PYTHONPATH=source_path(root), PYTHONUNBUFFERED="1", MILLM_DATA_DIR=str(data_dir), MILLM_CACHE_DIR=str(CACHE)
    )
    return env


def baseline(folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the bare load in a new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", BASELINE, str(folder)], check=True, capture_output=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def served(root: Path, env: dict[str, str], log: Path) -> dict[str, float]:
    """A new ``millm serve``: seconds to its first answer, to ``/api/health/ready`` 200, CPU to then, and
    the seconds of the first and second one-token completions after ready."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "millm_host.cli", "serve", "--port", str(port)]
    with open(log, "wb") as out:
        start = time.perf_counter()
        # cwd: ``python -m`` puts the working directory first on sys.path, before PYTHONPATH
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    figures: dict[str, float] = {}
    try:
        with httpx.Client(timeout=60) as http:
            while time.perf_counter() - start < 300:
                try:
                    answer = http.get(f"{base}/api/health/ready", timeout=2)
                except httpx.HTTPError:
                    answer = None
                if answer is not None:
                    figures.setdefault("listening", time.perf_counter() - start)
                    if answer.status_code == 200:
                        figures["ready"] = time.perf_counter() - start
                        figures["cpu"] = cpu_seconds(proc.pid)
                        model_id = answer.json()["model"]
                        break
                if proc.poll() is not None:
                    raise RuntimeError(log.read_text())
                time.sleep(0.02)
            else:
                raise TimeoutError(log.read_text())
            for name in ("first", "second"):
                began = time.perf_counter()
                body = {"model": model_id, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
                http.post(f"{base}/v1/completions", json=body).raise_for_status()
                figures[name] = time.perf_counter() - began
        return figures
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def phases(
    env: dict[str, str], data_dir: Path, hold: str, root: Path = REPO, importtime: bool = False
) -> subprocess.CompletedProcess:
    flags = ["-X", "importtime"] if importtime else []
    args = [str(time.time()), str(CACHE), str(data_dir), hold]
    return subprocess.run(
        [sys.executable, *flags, "-c", PHASES, *args], cwd=root, check=True, capture_output=True, text=True, env=env
    )


def median_marks(rounds: list[list[tuple[str, float, float, float]]]) -> list[tuple[str, float, float, float]]:
    """Each phase's median wall, CPU and collector seconds over rounds (named as in the first)."""
    return [
        (marks[0][0], *(statistics.median(m[i] for m in marks) for i in (1, 2, 3)))
        for marks in zip(*rounds, strict=True)
    ]


def phase_marks(result: subprocess.CompletedProcess) -> list[tuple[str, float, float, float]]:
    line = next(line for line in result.stdout.splitlines() if line.startswith("PHASES "))
    return [tuple(mark) for mark in json.loads(line.removeprefix("PHASES "))]


def import_groups(stderr: str) -> list[tuple[str, float]]:
    """Self seconds under ``-X importtime``, summed by package (torch and transformers by subpackage)."""
    groups: collections.Counter[str] = collections.Counter()
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _cumulative, name = line.removeprefix("import time:").split("|")
        name = name.strip()
        parts = name.split(".")
        key = ".".join(parts[:2]) if parts[0] in ("torch", "transformers") and len(parts) > 1 else parts[0]
        groups[key] += int(self_us) / 1e6
    return groups.most_common()


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--old", metavar="REF", help="also run millm serve from the source tree at this git ref")
    parser.add_argument("--as-is", action="store_true", help="keep PYTHONDONTWRITEBYTECODE if it is set")
    parser.add_argument("--phase-runs", type=int, default=3, help="rounds of the phase breakdown (medians)")
    args = parser.parse_args()

    folder = checkpoint_folder()
    work = Path(tempfile.mkdtemp(prefix="millm-warm-"))
    trees = {"this tree": REPO}
    if args.old:
        trees[f"at {args.old}"] = tree_at(args.old, work / "old")
    envs = {name: environ(root, work / slug(name), args.as_is) for name, root in trees.items()}
    loads = [load_average()]

    for name, env in envs.items():  # not timed: converts the model if needed, creates the database, writes bytecode
        served(trees[name], env, work / "untimed.log")
    baseline(folder, envs["this tree"])
    bare: list[tuple[float, float]] = []
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in envs}
    for _ in range(args.runs):
        bare.append(baseline(folder, envs["this tree"]))
        for name, env in envs.items():
            runs[name].append(served(trees[name], env, work / f"{slug(name)}.log"))
    loads.append(load_average())
    median = statistics.median

    this = runs["this tree"]
    print(
        f"warm start of the default model (transformers engine, float32 CPU, cached conversion); "
        f"median of {args.runs} rounds; bytecode cache {'as the environment says' if args.as_is else 'on'}"
    )
    print(f"load average (1, 5, 15 min) before: {loads[0]}, after: {loads[1]}; {os.cpu_count()} CPUs")
    print(f"  {'':60} {'wall':>7} {'CPU':>7}")
    print(
        f"  {'baseline: python, import torch + transformers, from_pretrained':60} "
        f"{median(w for w, _ in bare):6.2f}s {median(c for _, c in bare):6.2f}s"
    )
    for name, figures in runs.items():
        print(
            f"  {f'millm serve ({name}): first answer (listening)':60} {median(f['listening'] for f in figures):6.2f}s"
        )
        print(
            f"  {f'millm serve ({name}): /api/health/ready 200':60} "
            f"{median(f['ready'] for f in figures):6.2f}s {median(f['cpu'] for f in figures):6.2f}s"
        )
        print(
            f"  {'  then one-token completions, first / second':60} "
            f"{median(f['first'] for f in figures):6.3f}s / {median(f['second'] for f in figures):.3f}s"
        )
    wall_ratio = median(f["ready"] / w for f, (w, _) in zip(this, bare, strict=True))
    cpu_ratio = median(f["cpu"] / c for f, (_, c) in zip(this, bare, strict=True))
    print(f"  ratio millm serve (this tree) / baseline: wall {wall_ratio:.2f}, CPU {cpu_ratio:.2f}")
    for name, figures in runs.items():
        if name != "this tree":
            wall = median(a["ready"] / b["ready"] for a, b in zip(this, figures, strict=True))
            cpu = median(a["cpu"] / b["cpu"] for a, b in zip(this, figures, strict=True))
            print(f"  ratio millm serve (this tree) / ({name}): wall {wall:.2f}, CPU {cpu:.2f}")

    # The phases: each tree's process in turn, --phase-runs rounds, medians; then this tree once with the
    # collector on throughout (as before the hold), and once under -X importtime.
    phase_rounds: dict[str, list] = {name: [] for name in envs}
    for _ in range(args.phase_runs):
        for name, env in envs.items():
            phase_rounds[name].append(phase_marks(phases(env, work / slug(name), "held", trees[name])))
    marks = {name: median_marks(rounds) for name, rounds in phase_rounds.items()}
    data_dir, env = work / "this-tree", envs["this tree"]
    on = phase_marks(phases(env, data_dir, "on"))
    others = [name for name in envs if name != "this tree"]
    print(
        f"where the time goes (one process taking millm serve's steps in order; seconds, "
        f"median of {args.phase_runs}; load average now {load_average()}):"
    )
    header = "".join(f" | {name[:14]:>14}: {'CPU':>6}" for name in others)
    print(f"  {'':66} {'wall':>6} {'CPU':>6} {'in gc':>6}{header} | collector on: {'CPU':>6} {'in gc':>6}")
    rows = zip(marks["this tree"], *(marks[name] for name in others), on, strict=True)
    for this_mark, *other_marks, on_mark in rows:
        name, wall, cpu, gc_s = this_mark
        shown = "".join(f" | {'':14}  {m[2]:6.3f}" for m in other_marks)
        print(
            f"  {name[:66]:66} {wall:6.3f} {cpu:6.3f} {gc_s:6.3f}{shown} | {'':13} {on_mark[2]:6.3f} {on_mark[3]:6.3f}"
        )

    def total(rows: list, *, library: bool | None = None) -> tuple[float, float, float]:
        picked = [m for m in rows if library is None or m[0].startswith("library:") == library]
        return tuple(sum(m[i] for m in picked) for i in (1, 2, 3))  # type: ignore[return-value]

    for label, library in (
        ("total", None),
        ("  the libraries' imports (library: above)", True),
        ("  the rest: millm, its plugins, the load", False),
    ):
        wall, cpu, gc_s = total(marks["this tree"], library=library)
        shown = "".join(f" | {'':14}  {total(marks[name], library=library)[1]:6.3f}" for name in others)
        on_total = total(on, library=library)
        print(f"  {label:66} {wall:6.3f} {cpu:6.3f} {gc_s:6.3f}{shown} | {'':13} {on_total[1]:6.3f} {on_total[2]:6.3f}")
    groups = import_groups(phases(env, data_dir, "held", importtime=True).stderr)
    print("imports by package (self seconds under -X importtime, which inflates them):")
    for name, seconds in groups[:16]:
        print(f"  {name:40} {seconds:6.3f}")
    print(f"  {'everything else':40} {sum(s for _, s in groups[16:]):6.3f}")


if __name__ == "__main__":
    main()
