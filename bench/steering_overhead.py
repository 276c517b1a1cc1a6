"""Steering overhead: tokens/s steered against no steering (a profile, a 3-layer circuit, or GGUF).

``--mode profile`` (default): one SAE attached and a 10-feature profile active.
``--mode circuit``: a 3-layer circuit (SAEs at layers 5, 15, 25, 10 features each) on the
transformers engine; the budget is 2% per token. ``--mode gguf``: the profile on
``--engine gguf`` (llama.cpp control vectors); the budget is 5% per token.

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

    OMP_NUM_THREADS=1 .venv/bin/python bench/steering_overhead.py [--mode circuit|gguf] [--rounds 15] [--tokens 64]
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


def features(seed: int) -> list[dict]:
    return [{"index": 97 * i + 3 + seed, "strength": 2.0 if i % 2 else -1.5} for i in range(10)]


def setup(client, mode: str, saes: list[tuple[str, Path]]):
    """Register what ``mode`` steers with; (steered, baseline) functions that switch it on and off."""
    for sae_id, path in saes:
        client.post("/api/saes", json={"path": str(path), "sae_id": sae_id}).raise_for_status()

    def detach_all() -> None:
        for sae_id, _ in saes:
            if client.get(f"/api/saes/{sae_id}").json()["attached"]:
                client.post(f"/api/saes/{sae_id}/detach").raise_for_status()

    if mode == "circuit":
        members = [
            {"sae_id": sae_id, "layer": int(sae_id.rsplit("-", 1)[1]), "features": features(i)}
            for i, (sae_id, _) in enumerate(saes)
        ]
        doc = {"format": "mi.circuit/v1", "circuit_id": "crc_bench", "name": "bench", "rung": 2, "members": members}
        client.post("/api/circuits", json=doc).raise_for_status()

        def steered() -> None:
            for sae_id, _ in saes:
                client.post(f"/api/saes/{sae_id}/attach").raise_for_status()
            client.post("/api/circuits/crc_bench/activate").raise_for_status()

        def baseline() -> None:
            client.post("/api/circuits/crc_bench/deactivate").raise_for_status()
            detach_all()

        return steered, baseline
    sae_id = saes[0][0]
    profile = {"name": "bench", "sae_id": sae_id, "features": features(0)}
    client.post("/api/profiles", json=profile).raise_for_status()

    def steered_profile() -> None:
        client.post(f"/api/saes/{sae_id}/attach").raise_for_status()
        client.post("/api/profiles/bench/activate").raise_for_status()

    def baseline_profile() -> None:
        client.post("/api/profiles/deactivate").raise_for_status()
        detach_all()

    return steered_profile, baseline_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each configuration (median taken)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each run")
    parser.add_argument("--d-sae", type=int, default=16384, help="width of the generated SAE")
    parser.add_argument("--layer", type=int, default=15)
    parser.add_argument(
        "--mode",
        choices=("profile", "circuit", "gguf"),
        default="profile",
        help="profile: one SAE, a 10-feature profile (transformers); circuit: a 3-layer circuit (layers 5, "
        "15, 25; transformers, budget 2%%); gguf: the profile on the GGUF engine (control vectors, budget 5%%)",
    )
    args = parser.parse_args()

    wall: dict[str, list[float]] = {"baseline": [], "steered": []}
    cpu: dict[str, list[float]] = {"baseline": [], "steered": []}
    headers: dict[str, str] = {}
    lengths: dict[str, set[int]] = {"baseline": set(), "steered": set()}
    layers = (5, 15, 25) if args.mode == "circuit" else (args.layer,)
    with tempfile.TemporaryDirectory() as tmp:
        saes = [
            (
                f"bench-sae-{layer}",
                write_sae(Path(tmp) / f"bench-sae-{layer}", d_in=D_MODEL, d_sae=args.d_sae, layer=layer),
            )
            for layer in layers
        ]
        server_args = ["--engine", "gguf"] if args.mode == "gguf" else None
        server = ServerProcess(Path(tmp) / "data", env={"MILLM_SAE_DIRS": tmp}, args=server_args).start()
        try:
            pid = server.proc.pid  # the GGUF model computes in a child: its CPU time is not counted here
            with server.http(timeout=600) as client:
                model = client.get("/api/health").json()["model"]
                steered, baseline = setup(client, args.mode, saes)
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
        f"mode {args.mode}: model {model}, SAE d_sae={args.d_sae} at layers {list(layers)}, 10 features per layer, "
        f"{args.tokens} tokens per run, {args.rounds} interleaved runs each"
    )
    print(f"baseline X-miLLM-Steering: {headers['baseline']}")
    print(f"steered  X-miLLM-Steering: {headers['steered']}")
    print(f"completion tokens per run: baseline {sorted(lengths['baseline'])}, steered {sorted(lengths['steered'])}")
    report("tokens per wall-clock second", wall["baseline"], wall["steered"])
    if args.mode != "gguf":
        report("tokens per server CPU second", cpu["baseline"], cpu["steered"])
    budget = {"profile": None, "circuit": 2.0, "gguf": 5.0}[args.mode]
    if budget is not None:
        print(f"budget: overhead ≤ {budget}% per token")


if __name__ == "__main__":
    main()
