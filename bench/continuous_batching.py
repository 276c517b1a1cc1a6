"""Aggregate tokens/s with 1, 4 and 8 concurrent clients: serial against continuous batching.

Two ``millm serve`` processes on the default model (transformers engine, float32
CPU): one with ``MILLM_BATCHING=serial``, one with
``MILLM_BATCHING=continuous`` (the default). Each client streams one greedy chat completion
(a prompt of its own, ``--max-tokens``); the aggregate is every client's
completion tokens over the wall time from the first request to the last answer.
The baseline for the batch is transformers' own batched ``model.generate`` on the
same checkpoint in this process (left-padded, the same prompts, at the same
sizes). Time to first token (p50, p95) is measured at the largest size. Sizes are
run in turn on both servers, ``--runs`` times, after one untimed batch on each; each figure is
the median.

Wall-clock rates move with whatever else runs on the machine, so each figure also
comes as tokens per CPU-second: the tokens over the CPU time the server process
(all its threads, from ``/proc/PID/stat``) spent meanwhile, or, for ``generate``,
this process's own (``time.process_time``). That ratio holds up better on a loaded
machine; the 1-minute load average is printed beside each figure and at the end.

With ``--mixed``, the continuous server (``PROBE_FORCE_SERIAL=false``) also runs,
at each size, the same batch with half the clients steered (each its own 10
features of an SAE at layer 15, in the request) and two probes armed (dense, at
layers 10 and 20, reading every request), paired with plain batches: ``--pairs``
times a plain batch then a mixed one, and a plain one at the end, so each mixed
batch sits between two plain ones. Its ratio is the mixed rate over the mean of
its two neighbours' (target ≥ 0.95); the median and quartiles of these ratios are
printed. The machine's speed drifts by ±10% from one batch to the next on a
shared VM; pairing neighbours in time, and many pairs, is what makes a 5%
difference readable.

    python bench/continuous_batching.py [--runs 3] [--max-tokens 64] [--clients 1,4,8] [--mixed] [--pairs 8] [--gather-ms 0]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from millm_host.default_model import default_model_path
from millm_host.testing import ServerProcess, shared_cache_dir

TOPICS = ["a dragon who learns to cook", "the sea at night", "a robot gardener", "two rival bakers",
          "a lost key", "the first snow", "a lighthouse keeper", "a city under glass"]  # fmt: skip
MODEL = "SmolLM2-135M-Instruct"
STEER_SAE = "bench-steer-15"
#: (steered or plain client, millm's non-empty fields on its finish chunk) -> count: proof that steering and probes ran.
MIXED_FIELDS: collections.Counter[tuple[str, tuple[str, ...]]] = collections.Counter()


def messages(index: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a long story about {TOPICS[index % len(TOPICS)]}."}]


def converted_checkpoint() -> Path:
    """The float32 checkpoint the server converted the bundled GGUF into."""
    from millm_engine_transformers.loader import gguf_cache_dir

    return gguf_cache_dir(shared_cache_dir() / "model-cache", default_model_path())


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid``, all its threads (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def load() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


LOADS: list[float] = []  # the load average at the start of each measurement


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def steering(index: int) -> dict:
    """Half the clients (the odd ones) steer, each with features of its own; the others send nothing."""
    if index % 2 == 0:
        return {}
    features = [{"index": 97 * i + 3 + index, "strength": 2.0 if i % 2 else -1.5} for i in range(10)]
    return {"steering": {"sae_id": STEER_SAE, "features": features}}


def prepare_mixed(server: ServerProcess, sae_dir: Path) -> Callable[[bool], None]:
    """Register and attach the steering SAE, import the two probes; a function that arms or disarms them."""
    from probe_overhead import PROBES, import_probe

    with server.http(timeout=600) as http:
        http.post("/api/saes", json={"path": str(sae_dir), "sae_id": STEER_SAE}).raise_for_status()
        http.post(f"/api/saes/{STEER_SAE}/attach", json={}).raise_for_status()
        model_id = http.get("/api/health").json()["model"]
        identity = http.get(f"/api/models/{model_id}").json()
        vector = [1, *range(100, 147)]
        probes = [import_probe(http, identity, name, layer, rule, seed, vector) for name, layer, rule, seed in PROBES]

    def arm(on: bool) -> None:
        with server.http(timeout=600) as http:
            for probe_id in probes:
                http.post(f"/api/probes/{probe_id}/{'arm' if on else 'disarm'}", json={}).raise_for_status()

    return arm


def served(
    server: ServerProcess, clients: int, max_tokens: int, mixed: bool = False
) -> tuple[float, float, list[float]]:
    """(aggregate tokens/s, tokens per CPU-second of the server, each client's time to first token)
    of ``clients`` concurrent streams."""
    tokens = [0] * clients
    ttft = [0.0] * clients
    barrier = threading.Barrier(clients + 1)

    def client(index: int) -> None:
        api = server.openai(timeout=900)
        barrier.wait()
        start = time.perf_counter()
        for chunk in api.chat.completions.create(
            model=MODEL,
            messages=messages(index),
            temperature=0,
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=steering(index) if mixed else None,
        ):
            if not ttft[index] and chunk.choices and chunk.choices[0].delta.content:
                ttft[index] = time.perf_counter() - start
            if chunk.usage:
                tokens[index] = chunk.usage.completion_tokens
            if mixed and chunk.choices and chunk.choices[0].finish_reason:  # millm's fields ride on this chunk
                extras = {**(chunk.model_extra or {}), **(chunk.choices[0].model_extra or {})}
                MIXED_FIELDS[
                    ("steered" if index % 2 else "plain", tuple(sorted(k for k, v in extras.items() if v)))
                ] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    assert server.proc is not None
    LOADS.append(load())
    barrier.wait()
    start, cpu = time.perf_counter(), cpu_seconds(server.proc.pid)
    for thread in threads:
        thread.join()
    elapsed, spent = time.perf_counter() - start, cpu_seconds(server.proc.pid) - cpu
    return sum(tokens) / elapsed, sum(tokens) / max(spent, 1e-9), ttft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--clients", default="1,4,8")
    parser.add_argument("--mixed", action="store_true", help="also half the clients steered, two probes armed")
    parser.add_argument("--pairs", type=int, default=8, help="with --mixed: plain/mixed pairs per size")
    parser.add_argument("--gather-ms", type=int, default=0, help="the continuous server's MILLM_BATCH_GATHER_MS")
    args = parser.parse_args()
    sizes = [int(s) for s in args.clients.split(",")]

    sae_root = Path(tempfile.mkdtemp(prefix="millm-bench-sae-"))
    extra = {"MILLM_SAE_DIRS": str(sae_root), "PROBE_FORCE_SERIAL": "false"} if args.mixed else {}
    extra["MILLM_BATCH_GATHER_MS"] = str(args.gather_ms)
    servers = {
        mode: ServerProcess(
            Path(tempfile.mkdtemp(prefix=f"millm-bench-{mode}-")),
            env={"MILLM_BATCHING": mode, **(extra if mode == "continuous" else {})},
        )
        for mode in ("serial", "continuous")
    }
    for server in servers.values():
        server.start()
    arm: Callable[[bool], None] | None = None
    if args.mixed:
        from millm_saelens.testing import write_sae

        sae_dir = write_sae(sae_root / STEER_SAE, d_in=576, d_sae=4096, layer=15)
        arm = prepare_mixed(servers["continuous"], sae_dir)
    folder = converted_checkpoint()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def generate(size: int) -> tuple[float, float]:
        """(tokens/s, tokens per CPU-second of this process) of transformers' batched ``generate``."""
        texts = [tokenizer.apply_chat_template(messages(i), add_generation_prompt=True, tokenize=False)
                 for i in range(size)]  # fmt: skip
        batch = tokenizer(texts, add_special_tokens=False, return_tensors="pt", padding=True)
        LOADS.append(load())
        start, cpu = time.perf_counter(), time.process_time()
        with torch.inference_mode():
            out = model.generate(
                **batch, max_new_tokens=args.max_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        elapsed, spent = time.perf_counter() - start, time.process_time() - cpu
        new = out[:, batch["input_ids"].shape[1] :]
        eos = tokenizer.eos_token_id
        counted = 0
        for row in new.tolist():  # up to and with the first EOS, as usage counts
            counted += row.index(eos) + 1 if eos in row else len(row)
        return counted / elapsed, counted / max(spent, 1e-9)

    results: dict[tuple[str, int], list[float]] = {}
    per_cpu: dict[tuple[str, int], list[float]] = {}  # tokens per CPU-second

    def record(mode: str, size: int, rate: float, cpu_rate: float) -> None:
        results.setdefault((mode, size), []).append(rate)
        per_cpu.setdefault((mode, size), []).append(cpu_rate)
        print(f"  {mode} x{size}: {rate:.1f} tok/s, {cpu_rate:.1f} tok/CPU-s, load {LOADS[-1]:.2f}", flush=True)

    mixed_ratios: dict[int, list[float]] = {}

    def paired(server: ServerProcess, size: int) -> None:
        """``--pairs`` mixed batches, each between two plain ones; each one's ratio to their mean."""
        assert arm is not None
        before = served(server, size, args.max_tokens)
        for _ in range(args.pairs):
            arm(True)
            mixed = served(server, size, args.max_tokens, mixed=True)
            arm(False)
            after = served(server, size, args.max_tokens)
            record("mixed", size, *mixed[:2])
            record("plain", size, *after[:2])
            mixed_ratios.setdefault(size, []).append(mixed[0] / ((before[0] + after[0]) / 2))
            before = after

    for server in servers.values():  # untimed: a new server's first batch pays its warm-up (allocations, caches)
        served(server, max(sizes), min(args.max_tokens, 16))
    generate(max(sizes))  # and so does generate's
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} CPUs")
    ttfts: dict[str, list[float]] = {"serial": [], "continuous": []}
    try:
        for _ in range(args.runs):
            for size in sizes:
                for mode, server in servers.items():
                    rate, cpu_rate, ttft = served(server, size, args.max_tokens)
                    record(mode, size, rate, cpu_rate)  # progress, on a slow machine
                    if size == max(sizes):
                        ttfts[mode].extend(ttft)
                record("generate", size, *generate(size))
        if arm is not None:
            for size in sizes:
                paired(servers["continuous"], size)
        with servers["continuous"].http() as http:  # every request batched: serial_reasons stays empty
            print("continuous /api/health/inference:", http.get("/api/health/inference").json(), flush=True)
    finally:
        for server in servers.values():
            server.stop()

    for title, table in (("tok/s", results), ("tokens per CPU-second", per_cpu)):

        def median(mode: str, size: int, table: dict[tuple[str, int], list[float]] = table) -> float:
            return statistics.median(table[(mode, size)])

        one = median("serial", sizes[0])
        print(f"max_tokens={args.max_tokens} runs={args.runs} gather_ms={args.gather_ms} ({title}, medians)")
        print(f"{'clients':>7} {'serial':>8} {'continuous':>10} {'generate':>9} {'cont/serial':>11} "
              f"{'cont/generate':>13} {'cont/serial@1':>13}")  # fmt: skip
        for size in sizes:
            s, c, g = median("serial", size), median("continuous", size), median("generate", size)
            print(f"{size:>7} {s:>8.1f} {c:>10.1f} {g:>9.1f} {c / s:>11.2f} {c / g:>13.2f} {c / one:>13.2f}")
    if arm is not None:
        print(
            f"mixed (half steered, 2 probes armed) / the plain batches either side, tok/s; {args.pairs} pairs per size:"
        )
        print(f"{'clients':>7} {'plain':>8} {'mixed':>8} {'ratio: median':>14} {'quartiles':>14}")
        for size in sizes:
            ratios = mixed_ratios[size]
            low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
            plain, mixed = (statistics.median(results[(mode, size)]) for mode in ("plain", "mixed"))
            print(f"{size:>7} {plain:>8.1f} {mixed:>8.1f} {statistics.median(ratios):>14.3f} {low:>6.3f}-{high:<6.3f}")
        print("finish-chunk fields in the mixed runs:", dict(MIXED_FIELDS))
    for mode, values in ttfts.items():
        print(
            f"TTFT at {max(sizes)} clients, {mode}: p50 {percentile(values, 0.5) * 1000:.0f} ms,"
            f" p95 {percentile(values, 0.95) * 1000:.0f} ms"
        )
    print(
        f"load average during the measurements: min {min(LOADS):.2f}, median {statistics.median(LOADS):.2f},"
        f" max {max(LOADS):.2f} ({os.cpu_count()} CPUs)"
    )


if __name__ == "__main__":
    main()
