"""Aggregate tokens/s of the GGUF engine with 1, 4 and 8 concurrent clients: serial against GGUF_PARALLEL.

Two ``millm serve --engine gguf`` processes on the default model: one with
``GGUF_PARALLEL=1`` (one generation at a time), one with
``GGUF_PARALLEL=--rows`` (the child decodes the running generations together,
``millm_engine_gguf.batch``). Each client streams one greedy chat completion (a
prompt of its own, ``--max-tokens``); the aggregate is every client's completion
tokens over the wall time from the first request to the last answer
(``continuous_batching.served``). Sizes run in turn on both servers, ``--runs``
times; each figure is the median, and the ratio is against the serial server at
the same size, measured in the same run. Time to first token (p50, p95) is taken
at the largest size.

    python bench/gguf_parallel.py [--runs 3] [--max-tokens 64] [--clients 1,4,8] [--rows 8] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

from millm_host.default_model import default_model_path
from millm_host.testing import ServerProcess

sys.path.insert(0, str(Path(__file__).parent))
import continuous_batching  # noqa: E402  (its served(): the same clients and count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-ctx", type=int, default=1024)
    args = parser.parse_args()
    sizes = [int(s) for s in args.clients.split(",")]
    threads = str(args.threads)
    common = {
        "GGUF_N_CTX": str(args.n_ctx),
        "GGUF_N_THREADS": threads,
        "GGUF_N_THREADS_BATCH": threads,
        "GGUF_ENABLE_EMBEDDINGS": "false",
    }
    modes = {"serial": "1", "parallel": str(args.rows)}
    servers = {
        mode: ServerProcess(
            Path(tempfile.mkdtemp(prefix=f"millm-bench-gguf-{mode}-")),
            model=str(default_model_path()),
            args=["--engine", "gguf", "--log-level", "warning"],
            env={**common, "GGUF_PARALLEL": rows},
        )
        for mode, rows in modes.items()
    }
    for server in servers.values():
        server.start()
    continuous_batching.MODEL = httpx.get(f"{servers['serial'].base_url}/api/health").json()["model"]

    results: dict[tuple[str, int], list[float]] = {}
    ttfts: dict[str, list[float]] = {mode: [] for mode in modes}
    try:
        for server in servers.values():  # warm-up: page the weights in
            continuous_batching.served(server, 1, 4)
        for _ in range(args.runs):
            for size in sizes:
                for mode, server in servers.items():
                    rate, ttft = continuous_batching.served(server, size, args.max_tokens)
                    results.setdefault((mode, size), []).append(rate)
                    if size == max(sizes):
                        ttfts[mode].extend(ttft)
                    print(f"  {mode} x{size}: {rate:.1f} tok/s", flush=True)
        report = httpx.get(f"{servers['parallel'].base_url}/api/health/inference").json()
    finally:
        for server in servers.values():
            server.stop()

    def median(mode: str, size: int) -> float:
        return statistics.median(results[(mode, size)])

    one = median("serial", sizes[0])
    print(f"max_tokens={args.max_tokens} runs={args.runs} rows={args.rows} threads={args.threads} (tok/s, medians)")
    print(f"{'clients':>7} {'serial':>8} {'parallel':>9} {'par/serial':>10} {'par/serial@1':>12}")
    for size in sizes:
        s, p = median("serial", size), median("parallel", size)
        print(f"{size:>7} {s:>8.1f} {p:>9.1f} {p / s:>10.2f} {p / one:>12.2f}")
    for mode, values in ttfts.items():
        p50, p95 = continuous_batching.percentile(values, 0.5), continuous_batching.percentile(values, 0.95)
        print(f"TTFT at {max(sizes)} clients, {mode}: p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms")
    print(f"parallel server's /api/health/inference: {report}")


if __name__ == "__main__":
    main()
