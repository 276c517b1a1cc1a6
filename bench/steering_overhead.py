"""Steering overhead: tokens/s with one SAE attached and a 10-feature profile active, against no steering.

One ``millm serve`` on the default model (SmolLM2-135M-Instruct, hidden size 576)
and a random SAE written here (no download). Runs alternate between the
baseline (nothing attached, no profile) and the steered state (the SAE attached,
a 10-feature profile active), each a greedy ``/v1/completions`` of ``--tokens``
tokens, in ABBA order so drift in the machine's load cancels. Printed: the
ratio of the medians of ``--rounds`` runs each, and the median of the per-round
(adjacent, paired) ratios, which is the steadier figure on a shared machine.

    OMP_NUM_THREADS=1 .venv/bin/python bench/steering_overhead.py [--rounds 15] [--tokens 64]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from millm_host.testing import ServerProcess
from millm_steering.testing import write_sae

D_MODEL = 576
PROMPT = "The history of the lighthouse begins with"


def tokens_per_second(client, model: str, tokens: int) -> tuple[float, str]:
    started = time.perf_counter()
    response = client.post("/v1/completions", json={
        "model": model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0})
    elapsed = time.perf_counter() - started
    response.raise_for_status()
    return response.json()["usage"]["completion_tokens"] / elapsed, response.headers["x-millm-steering"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="runs of each configuration (median taken)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each run")
    parser.add_argument("--d-sae", type=int, default=16384, help="width of the generated SAE")
    parser.add_argument("--layer", type=int, default=15)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        sae = write_sae(Path(tmp) / "bench-sae", d_in=D_MODEL, d_sae=args.d_sae, layer=args.layer)
        server = ServerProcess(Path(tmp) / "data").start()
        try:
            with server.http(timeout=600) as client:
                model = client.get("/api/health").json()["model"]
                client.post("/api/saes", json={"path": str(sae), "sae_id": "bench-sae"}).raise_for_status()
                features = [{"index": 97 * i + 3, "strength": 2.0 if i % 2 else -1.5} for i in range(10)]
                client.post("/api/profiles", json={"name": "bench", "sae_id": "bench-sae",
                                                   "features": features}).raise_for_status()

                def steered() -> None:
                    client.post("/api/saes/bench-sae/attach").raise_for_status()
                    client.post("/api/profiles/bench/activate").raise_for_status()

                def baseline() -> None:
                    client.post("/api/profiles/deactivate").raise_for_status()
                    if client.get("/api/saes/bench-sae").json()["attached"]:
                        client.post("/api/saes/bench-sae/detach").raise_for_status()

                runs: dict[str, list[float]] = {"baseline": [], "steered": []}
                headers: dict[str, str] = {}
                order = [("baseline", baseline), ("steered", steered)]
                for round_ in range(args.rounds + 1):  # round 0 warms up both and is not counted
                    for name, prepare in order if round_ % 2 else order[::-1]:  # ABBA: drift cancels
                        prepare()
                        rate, header = tokens_per_second(client, model, args.tokens)
                        headers[name] = header
                        if round_:
                            runs[name].append(rate)
        finally:
            server.stop()

    base, steer = statistics.median(runs["baseline"]), statistics.median(runs["steered"])
    print(f"model {model}, SAE d_sae={args.d_sae} at layer {args.layer}, 10-feature profile, "
          f"{args.tokens} tokens per run, {args.rounds} interleaved runs each")
    print(f"baseline X-miLLM-Steering: {headers['baseline']}")
    print(f"steered  X-miLLM-Steering: {headers['steered']}")
    for name in runs:
        print(f"{name:9} tokens/s: " + " ".join(f"{r:.1f}" for r in runs[name]))
    paired = statistics.median(s / b for s, b in zip(runs["steered"], runs["baseline"]))
    print(f"median tokens/s: baseline {base:.2f}, steered {steer:.2f}")
    print(f"steered/baseline throughput ratio (medians): {steer / base:.4f} (overhead {100 * (1 - steer / base):+.2f}%)")
    print(f"steered/baseline throughput ratio (median of the {args.rounds} paired rounds): {paired:.4f} "
          f"(overhead {100 * (1 - paired):+.2f}%)")


if __name__ == "__main__":
    main()
