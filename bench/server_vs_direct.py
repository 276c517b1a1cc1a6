"""Tokens/s through the millm server against the same model's generate called directly.

One client, greedy, the same prompt and max_tokens. The baseline is
transformers' ``model.generate`` on the same checkpoint in this process; the
candidates are non-streamed and streamed chat completions through a real
``millm serve`` process (the default model, transformers engine, float32 CPU).
Runs are interleaved so background load hits both sides alike; each figure is
the median of ``--runs`` runs.

    python bench/server_vs_direct.py [--runs 7] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers

from millm_host.default_model import default_model_path
from millm_host.testing import ServerProcess, shared_cache_dir

PROMPT = [{"role": "user", "content": "Write a long story about a dragon who learns to cook."}]
MODEL = "SmolLM2-135M-Instruct"


def converted_checkpoint() -> Path:
    """The float32 checkpoint the server converted the bundled GGUF into."""
    from millm_engine_transformers.loader import gguf_cache_dir

    return gguf_cache_dir(shared_cache_dir() / "model-cache", default_model_path())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    server = ServerProcess(Path(tempfile.mkdtemp(prefix="millm-bench-"))).start()
    client = server.openai(timeout=600)
    folder = converted_checkpoint()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tokenizer(
        tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
        return_tensors="pt",
    )["input_ids"]

    def direct() -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=args.max_tokens, do_sample=False)
        return (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start)

    def served() -> float:
        start = time.perf_counter()
        reply = client.chat.completions.create(model=MODEL, messages=PROMPT, temperature=0, max_tokens=args.max_tokens)
        return reply.usage.completion_tokens / (time.perf_counter() - start)

    def streamed() -> float:
        start = time.perf_counter()
        tokens = 0
        for chunk in client.chat.completions.create(
            model=MODEL,
            messages=PROMPT,
            temperature=0,
            max_tokens=args.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        ):
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return tokens / (time.perf_counter() - start)

    try:
        direct(), served(), streamed()  # warm up
        rates: dict[str, list[float]] = {"direct": [], "server": [], "stream": []}
        for _ in range(args.runs):
            rates["direct"].append(direct())
            rates["server"].append(served())
            rates["stream"].append(streamed())
    finally:
        server.stop()
    median = {k: statistics.median(v) for k, v in rates.items()}
    print(f"model {MODEL}, {args.max_tokens} max tokens, greedy, median of {args.runs} runs")
    for name, value in median.items():
        print(f"  {name:7} {value:7.1f} tokens/s   (runs: {', '.join(f'{v:.1f}' for v in rates[name])})")
    print(f"ratio server/direct        {median['server'] / median['direct']:.3f}")
    print(f"ratio stream/direct        {median['stream'] / median['direct']:.3f}")


if __name__ == "__main__":
    main()
