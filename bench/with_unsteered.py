"""Both replies in one request (``with_unsteered``) against one steered request: the time ratio.

One ``millm serve`` on the default model (SmolLM2-135M-Instruct; ``--tiny``: a random 4-layer
Llama) with a random SAE written here (no download), attached at ``--layer``. Each run is a
greedy chat completion of ``--tokens`` tokens (``ignore_eos``: every run the same length) with
an inline 10-feature steering set, sent either plain (steered) or with ``with_unsteered: true``
(both replies, as rows of one batch). The two alternate in ABBA order so drift in the machine's
load cancels; round 0 warms both up and is not counted.

Printed: the median time of each, the ratio of the medians and the median of the per-round
paired ratios (time of one with_unsteered request over time of one steered request; the
target is at most 1.3). For reference, the same steered request with ``n: 2`` (two rows of
one batch, both steered) is timed in the same rotation: what the engine's second row costs on
this machine, the floor of the ratio (on a CPU a second row of a decode step is far from free).

    OMP_NUM_THREADS=2 .venv/bin/python bench/with_unsteered.py [--tiny] [--rounds 10] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from millm_host.testing import ServerProcess  # noqa: E402
from millm_host.testing.tiny_models import tiny_llama  # noqa: E402
from millm_saelens.testing import write_sae  # noqa: E402

DEFAULT_D_MODEL = 576  # SmolLM2-135M's hidden size
TINY_D_MODEL = 256
SAE_ID = "bench-with-unsteered"
MESSAGES = [{"role": "user", "content": "Tell me the history of the lighthouse, from its beginnings."}]


def features() -> list[dict]:
    return [{"index": 97 * i + 3, "strength": 4.0 if i % 2 else -3.0} for i in range(10)]


def timed(client, body: dict) -> tuple[float, dict]:
    """Seconds one request took, and its body."""
    started = time.perf_counter()
    response = client.post("/v1/chat/completions", json=body)
    took = time.perf_counter() - started
    response.raise_for_status()
    return took, response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a random 4-layer Llama instead of SmolLM2-135M")
    parser.add_argument("--rounds", type=int, default=10, help="runs of each (median taken)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each run")
    parser.add_argument("--d-sae", type=int, default=16384, help="width of the generated SAE")
    parser.add_argument("--layer", type=int, default=None, help="the SAE's layer (default 15; --tiny: 1)")
    args = parser.parse_args()
    layer = args.layer if args.layer is not None else (1 if args.tiny else 15)
    model_dir = None
    if args.tiny:
        model_dir = tiny_llama("unsteered-bench", hidden_size=TINY_D_MODEL, num_hidden_layers=4, intermediate_size=512)
    d_model = TINY_D_MODEL if args.tiny else DEFAULT_D_MODEL
    times: dict[str, list[float]] = {"steered": [], "with_unsteered": [], "steered_n2": []}
    with tempfile.TemporaryDirectory() as tmp:
        sae = write_sae(Path(tmp) / SAE_ID, d_in=d_model, d_sae=args.d_sae, layer=layer)
        server = ServerProcess(
            Path(tmp) / "data", model=str(model_dir) if model_dir else None, env={"MILLM_SAE_DIRS": tmp}
        ).start()
        try:
            with server.http(timeout=600) as client:
                model = client.get("/api/health").json()["model"]
                client.post("/api/saes", json={"path": str(sae), "sae_id": SAE_ID}).raise_for_status()
                client.post(f"/api/saes/{SAE_ID}/attach", json={}).raise_for_status()
                steered = {
                    "model": model,
                    "messages": MESSAGES,
                    "max_tokens": args.tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "steering": {"sae_id": SAE_ID, "features": features()},
                }
                both = {**steered, "with_unsteered": True}
                order = [("steered", steered), ("with_unsteered", both), ("steered_n2", {**steered, "n": 2})]
                replies: dict[str, dict] = {}
                for round_ in range(args.rounds + 1):  # round 0 warms up each and is not counted
                    for name, body in order if round_ % 2 else order[::-1]:  # ABCCBA: drift cancels
                        took, replies[name] = timed(client, body)
                        if round_:
                            times[name].append(took)
        finally:
            server.stop()
    one, two = replies["steered"], replies["with_unsteered"]
    assert two["choices"][0]["message"]["content"] == one["choices"][0]["message"]["content"]
    differ = two["choices"][0]["message"]["content"] != two["choices"][1]["message"]["content"]
    median = {name: statistics.median(values) for name, values in times.items()}
    paired = statistics.median(b / a for a, b in zip(times["steered"], times["with_unsteered"], strict=True))
    print(
        f"model {model}, {os.cpu_count()} cores, SAE d_sae={args.d_sae} at layer {layer}, 10 features, "
        f"{args.tokens} tokens per reply, {args.rounds} interleaved runs each"
    )
    print(
        f"completion tokens: steered {one['usage']['completion_tokens']}, with_unsteered "
        f"{two['usage']['completion_tokens']}; the steered replies are equal, the two variants "
        f"{'differ' if differ else 'are equal'}"
    )
    print(f"median seconds: steered {median['steered']:.3f}, with_unsteered {median['with_unsteered']:.3f}")
    print(
        f"with_unsteered / steered: {median['with_unsteered'] / median['steered']:.3f} (ratio of medians), "
        f"{paired:.3f} (median of paired rounds); target <= 1.3"
    )
    # What a second row of the batch costs this engine on this machine, whatever it holds: the floor of the ratio.
    print(
        f"reference, the same steered request with n=2 (two rows, no unsteered one): {median['steered_n2']:.3f} s, "
        f"{median['steered_n2'] / median['steered']:.3f} x steered; with_unsteered / n=2: "
        f"{median['with_unsteered'] / median['steered_n2']:.3f}"
    )


if __name__ == "__main__":
    main()
