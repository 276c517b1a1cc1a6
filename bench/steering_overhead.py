"""Steering overhead: tokens/s with one SAE attached and a 10-feature profile active, against no steering.

One ``millm serve`` on the default model (SmolLM2-135M-Instruct, hidden size 576)
and a random SAE written here (no download). Runs alternate between the
baseline (nothing attached, no profile) and the steered state (the SAE attached,
a 10-feature profile active), each a greedy ``/v1/completions`` of ``--tokens``
tokens, in ABBA order so drift in the machine's load cancels.

Two throughputs per run: tokens per wall-clock second, and tokens per second of
the server process's CPU time (read from /proc; steadier when other work shares
the machine, since time spent waiting for a core is not counted). Each is
printed as the ratio of the medians (``--rounds`` runs each) and as the median
of the per-round paired ratios.

    OMP_NUM_THREADS=1 .venv/bin/python bench/steering_overhead.py [--rounds 15] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from millm_host.testing import ServerProcess
from millm_saelens.testing import write_sae

D_MODEL = 576
PROMPT = "The history of the lighthouse begins with"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def run(client, pid: int, model: str, tokens: int) -> tuple[int, float, float, str]:
    """(tokens, tokens per wall second, tokens per server CPU second, X-miLLM-Steering) of one completion."""
    cpu, started = cpu_seconds(pid), time.perf_counter()
    response = client.post(
        "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0}
    )
    wall, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
    response.raise_for_status()
    generated = response.json()["usage"]["completion_tokens"]
    return generated, generated / wall, generated / cpu, response.headers["x-millm-steering"]


def report(label: str, baseline: list[float], steered: list[float]) -> None:
    medians = statistics.median(steered) / statistics.median(baseline)
    paired = statistics.median(s / b for s, b in zip(steered, baseline, strict=True))
    print(
        f"{label}: baseline median {statistics.median(baseline):.2f}, steered median {statistics.median(steered):.2f}"
    )
    print(
        f"  steered/baseline: {medians:.4f} (ratio of medians), {paired:.4f} (median of paired rounds); "
        f"overhead {100 * (1 - paired):+.2f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each configuration (median taken)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each run")
    parser.add_argument("--d-sae", type=int, default=16384, help="width of the generated SAE")
    parser.add_argument("--layer", type=int, default=15)
    args = parser.parse_args()

    wall: dict[str, list[float]] = {"baseline": [], "steered": []}
    cpu: dict[str, list[float]] = {"baseline": [], "steered": []}
    headers: dict[str, str] = {}
    lengths: dict[str, set[int]] = {"baseline": set(), "steered": set()}
    with tempfile.TemporaryDirectory() as tmp:
        sae = write_sae(Path(tmp) / "bench-sae", d_in=D_MODEL, d_sae=args.d_sae, layer=args.layer)
        server = ServerProcess(Path(tmp) / "data", env={"MILLM_SAE_DIRS": tmp}).start()
        try:
            pid = server.proc.pid
            with server.http(timeout=600) as client:
                model = client.get("/api/health").json()["model"]
                client.post("/api/saes", json={"path": str(sae), "sae_id": "bench-sae"}).raise_for_status()
                features = [{"index": 97 * i + 3, "strength": 2.0 if i % 2 else -1.5} for i in range(10)]
                client.post(
                    "/api/profiles", json={"name": "bench", "sae_id": "bench-sae", "features": features}
                ).raise_for_status()

                def steered() -> None:
                    client.post("/api/saes/bench-sae/attach").raise_for_status()
                    client.post("/api/profiles/bench/activate").raise_for_status()

                def baseline() -> None:
                    client.post("/api/profiles/deactivate").raise_for_status()
                    if client.get("/api/saes/bench-sae").json()["attached"]:
                        client.post("/api/saes/bench-sae/detach").raise_for_status()

                order = [("baseline", baseline), ("steered", steered)]
                for round_ in range(args.rounds + 1):  # round 0 warms up both and is not counted
                    for name, prepare in order if round_ % 2 else order[::-1]:  # ABBA: drift cancels
                        prepare()
                        generated, per_wall, per_cpu, headers[name] = run(client, pid, model, args.tokens)
                        lengths[name].add(generated)
                        if round_:
                            wall[name].append(per_wall)
                            cpu[name].append(per_cpu)
        finally:
            server.stop()

    print(
        f"model {model}, SAE d_sae={args.d_sae} at layer {args.layer}, 10-feature profile, "
        f"{args.tokens} tokens per run, {args.rounds} interleaved runs each"
    )
    print(f"baseline X-miLLM-Steering: {headers['baseline']}")
    print(f"steered  X-miLLM-Steering: {headers['steered']}")
    print(f"completion tokens per run: baseline {sorted(lengths['baseline'])}, steered {sorted(lengths['steered'])}")
    report("tokens per wall-clock second", wall["baseline"], wall["steered"])
    report("tokens per server CPU second", cpu["baseline"], cpu["steered"])


if __name__ == "__main__":
    main()
