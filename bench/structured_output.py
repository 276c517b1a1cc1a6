"""Decode speed with a json_schema constraint against unconstrained, on the default model.

Runs the transformers engine in process on SmolLM2-135M-Instruct (float32, CPU)
and generates from the same chat prompt, greedy, alternating an unconstrained
run and a constrained one (the structured_output plugin's own constraint), so
both see the same machine load. Two rows: a json_schema response_format, and
the generic tool-call format (SmolLM2's template takes no tools; ``tool_choice:
"auto"``, so the constraint allows every tool's call or an answer). Decode speed is tokens per second after the
first token (the prompt pass is the same for both and left out). Prints, per row, the
median of each and their ratio (and the median of the per-run ratios) (target: constrained / unconstrained >= 0.8),
and the median time the constraint itself takes per token.

    OMP_NUM_THREADS=1 python bench/structured_output.py [--runs 9] [--tokens 64]

The first load converts the bundled GGUF once (cached in MILLM_CACHE_DIR,
defaulting here to the test cache).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

REVIEW = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "reviewer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 24},
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            },
            "required": ["name", "stars"],
        },
        "summary": {"type": "string", "minLength": 40, "maxLength": 200},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 3, "maxItems": 6},
    },
    "required": ["sentiment", "reviewer", "summary", "keywords"],
    "additionalProperties": False,
}
MESSAGES = [
    {"role": "system", "content": "You turn reviews into JSON."},
    {
        "role": "user",
        "content": "Review by Ana: 'Great little cafe, friendly staff, the cake was dry "
        "and the coffee was excellent, I will come back.' 4 stars.",
    },
]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Flights between two airports on a day",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string", "maxLength": 3},
                    "destination": {"type": "string", "maxLength": 3},
                    "date": {"type": "string", "format": "date"},
                    "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["origin", "destination", "date"],
            },
        },
    },
]
TOOL_MESSAGES = [
    {"role": "user", "content": "What is the weather like in Paris, and are there flights LHR to CDG on 2025-06-01?"}
]


def load_engine():
    from millm_engine_transformers.engine import TransformersEngine
    from millm_engine_transformers.spec import describe
    from millm_host.default_model import default_model_path, describe_default
    from millm_host.settings import Settings
    from millm_host.testing.server import shared_cache_dir

    os.environ.setdefault("MILLM_CACHE_DIR", str(shared_cache_dir() / "model-cache"))
    descriptor = describe_default(describe(str(default_model_path())))
    return TransformersEngine.load(descriptor, Settings(), lambda message: print("  load:", message))


class Timed:
    """Wraps a logits processor and adds up the time spent in it."""

    def __init__(self, process) -> None:
        self.process, self.seconds, self.calls = process, 0.0, 0

    def __call__(self, generated, logits):
        start = time.perf_counter()
        try:
            return self.process(generated, logits)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def decode_rate(engine, prompt, params, processor, limit: int) -> tuple[float, int]:
    """Tokens per second after the first token, and the number of tokens generated."""
    eos = engine.info.eos_token_ids
    tokens = engine.generate(prompt, params, logits_processors=[processor] if processor else [])
    count, first = 0, None
    try:
        for token in tokens:
            if first is None:
                first = time.perf_counter()
            count += 1
            if (processor is not None and token in eos) or count >= limit:
                break
    finally:
        tokens.close()
    return (count - 1) / (time.perf_counter() - first), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="runs of each (median reported; at least 5)")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per run (a constrained run may end sooner)")
    args = parser.parse_args()

    import torch

    from millm_host.engine import SamplingParams
    from millm_structured_output.response_format import parse_response_format
    from millm_structured_output.tools.generic import describe_tools, reply_format, show_tools
    from millm_structured_output.tools.request import parse_tool_request

    print(f"torch threads: {torch.get_num_threads()}")
    engine = load_engine()
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0)
    schema_format = parse_response_format({"type": "json_schema", "json_schema": {"name": "review", "schema": REVIEW}})
    tools = parse_tool_request({"tools": TOOLS})
    conversation = [dict(m) for m in TOOL_MESSAGES]
    show_tools(conversation, describe_tools(tools), engine.info.chat_template)
    rows = {
        "json_schema": measure(engine, engine.chat_ids(MESSAGES), schema_format, params, args),
        "generic tools": measure(engine, engine.chat_ids(conversation), reply_format(tools), params, args),
    }
    print()
    for name, (plain, constrained, cost, paired) in rows.items():
        print(
            f"{name:14s} unconstrained {plain:6.1f} tok/s  constrained {constrained:6.1f} tok/s  "
            f"constraint {cost:.3f} ms/token  ratio {constrained / plain:.3f} (paired {paired:.3f}; target >= 0.8)"
        )


def measure(engine, prompt, fmt, params, args) -> tuple[float, float, float, float]:
    """Median unconstrained and constrained rates, the constraint's median ms/token, the median paired ratio."""
    from millm_structured_output.constraint import ConstraintCompiler, JsonConstraint

    compiler = ConstraintCompiler()
    compiler.prepare(engine, fmt)  # compile once: the cache is what serving uses
    eos = sorted(engine.info.eos_token_ids)
    print(f"-- {fmt.name}")
    plain_rates, constrained_rates, per_token_ms = [], [], []
    decode_rate(engine, prompt, params, None, 8)  # warm-up
    for run in range(max(5, args.runs)):
        plain, _ = decode_rate(engine, prompt, params, None, args.tokens)
        timed = Timed(JsonConstraint(compiler.matcher(engine, fmt), engine.info.vocab_size, eos))
        constrained, length = decode_rate(engine, prompt, params, timed, args.tokens)
        plain_rates.append(plain)
        constrained_rates.append(constrained)
        per_token_ms.append(1000 * timed.seconds / timed.calls)
        print(
            f"run {run}: unconstrained {plain:6.1f} tok/s   constrained {constrained:6.1f} tok/s "
            f"({length} tokens, constraint {per_token_ms[-1]:.3f} ms/token)"
        )
    paired = statistics.median(c / p for c, p in zip(constrained_rates, plain_rates, strict=True))
    return (
        statistics.median(plain_rates),
        statistics.median(constrained_rates),
        statistics.median(per_token_ms),
        paired,
    )


if __name__ == "__main__":
    main()
