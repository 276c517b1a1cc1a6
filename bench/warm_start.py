"""Warm start: from ``millm serve`` to a ready model, its conversion already cached.

The baseline, measured in the same run, is what any server of this model must pay:
a bare ``python`` that imports torch and transformers and loads the same cached
checkpoint (tokenizer and weights). The candidate is ``millm serve`` on the
default model restarted on one data directory (its database already migrated, as
on every restart), polled on ``/api/health`` every 20 ms until ready. Runs alternate so background load
hits both alike; each figure is the median of ``--runs`` runs. The ratio is
candidate / baseline: 1.0 would mean millm adds nothing to the load itself. CPU
seconds (user + system, up to ready) are printed beside wall seconds: on a shared
machine they move far less with other people's load.

Then one run in-process says where the server's time goes, phase by phase, in
the order ``millm serve`` meets them.

    python bench/warm_start.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from millm_host.default_model import default_model_path
from millm_host.testing import ServerProcess, shared_cache_dir

BASELINE = """
import sys, time
import torch, transformers
folder = sys.argv[1]
transformers.AutoTokenizer.from_pretrained(folder)
transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
"""

PHASES = """
import json, sys, tempfile, time
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
from millm_host.app import Host
from millm_host import hookcalls
from millm_host.plugins import build_plugin_manager
from millm_host.settings import Settings
mark("import millm_host")
settings = Settings(environ={"MILLM_DATA_DIR": sys.argv[2], "MILLM_CACHE_DIR": sys.argv[1]})
pm = build_plugin_manager(settings)
mark("plugins: import and settings")
host = Host(settings, pm)
mark("host: fields, engines, database engine")
host.db.upgrade(host.migrations())
mark("migrations (a database at head)")
host.registry.discover()
hookcalls.startup(pm, "startup", host=host)
mark("discovery and plugin startup")
import falcon.asgi
from millm_host import routes
routes.install(falcon.asgi.App(), host)
mark("routes")
import uvicorn
mark("import uvicorn")
import torch
mark("import torch")
import transformers
mark("import transformers")
entry = host.registry.start_model
engine = entry.spec.load(entry.descriptor, settings, lambda message: mark(f"load, until {message[:40]!r}"))
mark("load, the rest")
for impl in pm.hook.model_loaded.get_hookimpls():
    impl.function(**{k: v for k, v in {"host": host, "engine": engine}.items() if k in impl.argnames})
    mark(f"model_loaded: {impl.plugin_name}")
print(json.dumps([(name, round(t - marks[i][1], 3)) for i, (name, t) in enumerate(marks[1:])]))
"""


def converted_checkpoint() -> Path:
    from millm_engine_transformers.loader import gguf_cache_dir

    return gguf_cache_dir(shared_cache_dir() / "model-cache", default_model_path())


def baseline(folder: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of the bare load in a new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", BASELINE, str(folder)], check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a running process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served(data_dir: Path) -> tuple[float, float, float]:
    """(seconds to the first /api/health answer, seconds to ready, CPU seconds to ready) of a new
    ``millm serve`` on ``data_dir``."""
    server = ServerProcess(data_dir, wait_for=None)
    server._log = open(server.log_path, "wb")
    start = time.perf_counter()
    server.proc = subprocess.Popen(
        server.cmd, env=server.env, stdout=server._log, stderr=subprocess.STDOUT, start_new_session=True
    )
    listening = None
    try:
        with httpx.Client(timeout=2) as http:
            while time.perf_counter() - start < 300:
                try:
                    status = http.get(f"{server.base_url}/api/health").json()["status"]
                except httpx.HTTPError:
                    status = None
                if status is not None and listening is None:
                    listening = time.perf_counter() - start
                if status == "ok":
                    return listening, time.perf_counter() - start, cpu_seconds(server.proc.pid)
                if server.proc.poll() is not None or status == "failed":
                    raise RuntimeError(server.log())
                time.sleep(0.02)
        raise TimeoutError(server.log())
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    folder = converted_checkpoint()
    data_dir = Path(tempfile.mkdtemp(prefix="millm-warm-"))
    served(data_dir)  # not timed: converts the model if it is not cached yet, creates the database
    bare, bare_cpu, listening, ready, ready_cpu = [], [], [], [], []
    for _ in range(args.runs):
        wall, cpu = baseline(folder)
        bare.append(wall)
        bare_cpu.append(cpu)
        first, done, cpu = served(data_dir)
        listening.append(first)
        ready.append(done)
        ready_cpu.append(cpu)
    median = statistics.median

    phases = subprocess.run(
        [sys.executable, "-c", PHASES, str(shared_cache_dir() / "model-cache"), str(data_dir)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    print(f"warm start of the default model (transformers engine, cached conversion), median of {args.runs} runs")
    print(f"  {'':56} {'wall':>7} {'CPU':>7}")
    print(f"  {'baseline: python, import torch + transformers, load':56} {median(bare):6.2f}s {median(bare_cpu):6.2f}s")
    print(f"  {'millm serve: first /api/health answer':56} {median(listening):6.2f}s")
    print(f"  {'millm serve: ready (status ok)':56} {median(ready):6.2f}s {median(ready_cpu):6.2f}s")
    print(
        f"  ratio millm / baseline: wall {median(ready) / median(bare):.2f}, "
        f"CPU {median(ready_cpu) / median(bare_cpu):.2f}"
    )
    print("where the time goes (one in-process run, phases in serving order):")
    for name, seconds in json.loads(phases.stdout.strip().splitlines()[-1]):
        print(f"  {name:60} {seconds:6.3f} s")


if __name__ == "__main__":
    main()
