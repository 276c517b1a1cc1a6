"""Scoring and embeddings through the millm server against the same forward pass called directly.

The baseline is one forward pass of the same checkpoint in this process, with
the log-softmax (scoring) or mean pooling (embeddings) a client would compute
itself. The candidates are the same requests through a real ``millm serve``
process (the default model, transformers engine, float32 CPU): a JEV-style
scoring request (``logprobs: 2``, two allowed tokens) and a one-input embedding.
A second server serves the converted checkpoint (not the GGUF file, which has no
faithful float32 copy) in bfloat16 to price ``scoring_precision: "float32"`` (a
float32 copy built per request) against native bfloat16 scoring.
Runs are interleaved so background load hits both sides alike; each figure is
the median of ``--runs`` runs.

    python bench/scoring_vs_direct.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from millm_host.default_model import default_model_path
from millm_host.testing import ServerProcess, shared_cache_dir

MODEL = "SmolLM2-135M-Instruct"
PROMPT = (
    "[kind] review\n[text] The soup was cold and the waiter ignored us for an hour.\n"
    "[question] Is this review positive?\n[options]\nfalse\ntrue\n[decision]:"
)


def converted_checkpoint() -> Path:
    """The float32 checkpoint the server converted the bundled GGUF into."""
    from millm_engine_transformers.loader import gguf_cache_dir

    return gguf_cache_dir(shared_cache_dir() / "model-cache", default_model_path())


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    folder = converted_checkpoint()
    server = ServerProcess(Path(tempfile.mkdtemp(prefix="millm-bench-"))).start()
    bf16 = ServerProcess(
        Path(tempfile.mkdtemp(prefix="millm-bench-")), model=str(folder), env={"MILLM_DTYPE": "bfloat16"}
    ).start()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([tokenizer(PROMPT)["input_ids"]])
    allowed = [tokenizer(" false")["input_ids"][0], tokenizer(" true")["input_ids"][0]]
    scoring = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1, "logprobs": 2, "allowed_token_ids": allowed}

    def direct_score() -> None:
        with torch.inference_mode():
            logits = model(ids, logits_to_keep=1).logits[0, -1].float()
            torch.log_softmax(logits[allowed], dim=-1).tolist()

    def direct_embed() -> None:
        with torch.inference_mode():
            model.model(ids).last_hidden_state[0].mean(0).tolist()

    def post(target: ServerProcess, path: str, body: dict) -> Callable[[], None]:
        client = target.http()

        def send() -> None:
            reply = client.post(path, json=body)
            assert reply.status_code == 200, reply.text

        return send

    cases = {
        "direct score": direct_score,
        "server score": post(server, "/v1/completions", scoring),
        "direct embed": direct_embed,
        "server embed": post(server, "/v1/embeddings", {"model": MODEL, "input": PROMPT}),
        "bf16 native": post(bf16, "/v1/completions", {**scoring, "model": folder.name}),
        "bf16 float32": post(
            bf16, "/v1/completions", {**scoring, "model": folder.name, "scoring_precision": "float32"}
        ),
    }
    try:
        for case in cases.values():
            case()  # warm up
        seconds: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, case in cases.items():
                seconds[name].append(timed(case))
    finally:
        server.stop()
        bf16.stop()
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"model {MODEL}, {ids.shape[1]}-token prompt, median of {args.runs} runs")
    for name, value in median.items():
        print(f"  {name:13} {value * 1000:8.1f} ms   (runs: {', '.join(f'{v * 1000:.1f}' for v in seconds[name])})")
    print(f"ratio server/direct scoring     {median['server score'] / median['direct score']:.3f}")
    print(f"ratio server/direct embedding   {median['server embed'] / median['direct embed']:.3f}")
    print(f"ratio float32 copy/native bf16  {median['bf16 float32'] / median['bf16 native']:.3f}")


if __name__ == "__main__":
    main()
