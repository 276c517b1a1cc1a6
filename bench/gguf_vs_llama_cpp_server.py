"""Tokens/s of chat through millm's GGUF engine against llama-cpp-python's own OpenAI server.

Both servers load the same .gguf file (default: the bundled SmolLM2-135M-Instruct
Q4_1) with the same context window, batch, threads and flash attention, and get the same
non-streaming chat request: same messages, same ``max_tokens``, greedy
(``temperature: 0``; ``llama_cpp.server`` also gets ``repeat_penalty: 1.0``,
since its default of 1.1 is not greedy). A run's figure is
``usage.completion_tokens`` over the request's wall time. Runs alternate
between the servers (the order flips every run) after one warm-up each, and the
script prints each side's median and the ratio millm / llama_cpp.server
(target >= 1.0), both of the two medians and the median of each run's pair,
which cancels the drift of a shared machine's load.

``python -m llama_cpp.server`` needs llama-cpp-python's server extra:
``pip install fastapi sse-starlette starlette-context pydantic-settings``
(what ``pip install 'llama-cpp-python[server]'`` adds, without rebuilding it).

    python bench/gguf_vs_llama_cpp_server.py [--runs 7] [--max-tokens 128] [--threads 1] [--model PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from millm_host.default_model import default_model_path
from millm_host.testing import ServerProcess, free_port

MESSAGES = [{"role": "user", "content": "Write a long story about a dragon who learns to bake bread."}]


def start_llama_cpp_server(model: Path, n_ctx: int, threads: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        str(n_ctx),
        "--n_batch",
        "512",
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--flash_attn",
        "True",  # as millm loads llama.cpp (GGUF_FLASH_ATTN's default)
        "--verbose",
        "False",
    ]
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    return proc, wait_until_serving(proc, base, "/v1/models", "llama_cpp.server", log)


def wait_until_serving(proc: subprocess.Popen, base: str, path: str, name: str, log: Path) -> str:
    """``base`` once ``GET path`` answers 200 (within 120 s); a server that exits or never answers fails."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{base}{path}", timeout=2).status_code == 200:
                return base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError(f"{name} did not start")


def timed_chat(client: httpx.Client, url: str, body: dict) -> tuple[float, int, str]:
    started = time.perf_counter()
    response = client.post(url, json=body)
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    payload = response.json()
    tokens = payload["usage"]["completion_tokens"]
    return tokens / elapsed, tokens, payload["choices"][0]["message"]["content"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=default_model_path())
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.runs < 5:
        parser.error("--runs must be at least 5")
    work = Path(tempfile.mkdtemp(prefix="bench-gguf-"))
    millm = ServerProcess(
        work / "millm",
        model=str(args.model),
        args=["--engine", "gguf", "--log-level", "warning"],
        env={
            "GGUF_N_CTX": str(args.n_ctx),
            "GGUF_N_BATCH": "512",
            "GGUF_N_THREADS": str(args.threads),
            "GGUF_N_THREADS_BATCH": str(args.threads),
            "GGUF_ENABLE_EMBEDDINGS": "false",
        },
    ).start()
    llama_proc, llama_base = start_llama_cpp_server(args.model, args.n_ctx, args.threads, work / "llama.log")
    try:
        model_id = httpx.get(f"{millm.base_url}/api/health").json()["model"]
        common = {"messages": MESSAGES, "temperature": 0, "max_tokens": args.max_tokens}
        sides = {
            "millm": (f"{millm.v1}/chat/completions", {**common, "model": model_id}),
            "llama_cpp.server": (
                f"{llama_base}/v1/chat/completions",
                {**common, "model": str(args.model), "repeat_penalty": 1.0},
            ),
        }
        rates: dict[str, list[float]] = {name: [] for name in sides}
        texts: dict[str, str] = {}
        counts: dict[str, int] = {}
        with httpx.Client(timeout=600) as client:
            for name, (url, body) in sides.items():  # warm-up: page the weights in, fill the prompt cache
                _, counts[name], texts[name] = timed_chat(client, url, body)
            order = list(sides)
            for run in range(args.runs):
                for name in order if run % 2 == 0 else reversed(order):
                    url, body = sides[name]
                    rate, counts[name], _ = timed_chat(client, url, body)
                    rates[name].append(rate)
    finally:
        millm.stop()
        llama_proc.terminate()
        llama_proc.wait(15)
    print(
        f"model {args.model.name}, n_ctx {args.n_ctx}, threads {args.threads}, max_tokens {args.max_tokens}, "
        f"{args.runs} runs each (cpu count {os.cpu_count()})"
    )
    if texts["millm"] != texts["llama_cpp.server"]:
        print("warning: the two greedy answers differ")
    for name, values in rates.items():
        print(
            f"{name:18} {counts[name]:4d} tokens  median {statistics.median(values):7.2f} tok/s  "
            f"runs " + " ".join(f"{v:.1f}" for v in values)
        )
    ratio = statistics.median(rates["millm"]) / statistics.median(rates["llama_cpp.server"])
    # Each run's two measurements are adjacent in time, so their ratio cancels slow load drift.
    paired = statistics.median(m / c for m, c in zip(rates["millm"], rates["llama_cpp.server"], strict=True))
    print(
        f"ratio millm / llama_cpp.server: {ratio:.3f} of the medians, {paired:.3f} median of paired runs "
        f"(target >= 1.0)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
