"""PEFT LoRA adapters on the transformers engine, checked against peft's own forward.

A tiny adapter is built with ``peft`` itself on the tiny random Llama (random nonzero
``lora_B``, so it changes every output) and saved. A request served with it gives what
``PeftModel`` gives (greedy tokens, log-probabilities, scores within 1e-4); one without
it gives the plain model's; in a continuous batch each row gets its own adapter or none,
exactly what it gets alone; scoring (native and the float32 copy) applies it; layer hooks
still sit on the same decoder layers; an unload waits for the generations using it.
"""

from __future__ import annotations

import contextvars
import threading
from pathlib import Path

import pytest
import torch

from millm_host.api import LayerHook, LoraAdapter, SamplingParams, ScoringParams
from millm_host.engine import SERVED_ADAPTER  # what the host sets around a request's engine work

from .test_batching import load, run

TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]
PROMPTS = [[1, 2, 3, 4, 5, 6], [7, 8, 9], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [21]]


def make_adapter(base_dir: Path, out: Path, seed: int, targets=TARGETS) -> Path:
    """A LoRA adapter saved by peft, with random nonzero ``lora_B`` (peft starts it at zero: no change)."""
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base_dir)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets)
    adapted = peft.get_peft_model(model, config)
    randomize_lora_b(adapted, seed, scale=0.5)
    adapted.save_pretrained(out)
    return out


def randomize_lora_b(adapted, seed: int, scale: float) -> None:
    """Random nonzero ``lora_B`` weights in a peft model (peft starts them at zero: no change)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)


def reference_models(base_dir: Path, adapter_dirs: dict[str, Path]) -> dict:
    """peft's own model for each adapter, and the plain model: ``{None: plain, "alpha": PeftModel, ...}``."""
    import peft
    import transformers

    def plain():
        return transformers.AutoModelForCausalLM.from_pretrained(base_dir).eval()

    models = {name: peft.PeftModel.from_pretrained(plain(), path).eval() for name, path in adapter_dirs.items()}
    models[None] = plain()
    return models


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loras")
    return {
        "alpha": make_adapter(tiny_model_dir, root / "alpha", seed=1),
        "beta": make_adapter(tiny_model_dir, root / "beta", seed=2, targets=["k_proj", "up_proj", "gate_proj"]),
    }


@pytest.fixture(scope="module")
def adapters(adapter_dirs) -> dict[str, LoraAdapter]:
    return {name: LoraAdapter(name, str(path), "tiny") for name, path in adapter_dirs.items()}


@pytest.fixture(scope="module")
def reference(tiny_model_dir, adapter_dirs):
    return reference_models(tiny_model_dir, adapter_dirs)


def greedy(model, ids: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy tokens and their log-probabilities, one full forward per step."""
    tokens, logprobs, seq = [], [], list(ids)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([seq])).logits[0, -1].float()
            token = int(logits.argmax())
            tokens.append(token)
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            seq.append(token)
    return tokens, logprobs


def served(adapter: LoraAdapter | None, fn, *args):
    """``fn(*args)`` as the host calls the engine for a request served with ``adapter``."""
    context = contextvars.copy_context()
    context.run(SERVED_ADAPTER.set, adapter)
    return context.run(fn, *args)


def generated(engine, ids, adapter, steps=6) -> tuple[list[int], list[float]]:
    out = served(adapter, run, engine, ids, SamplingParams(max_tokens=steps, temperature=0, logprobs=1))
    return [int(t) for t in out], [t.logprob for t in out]


@pytest.fixture(scope="module", params=["serial", "continuous"])
def engine(request, tiny_model_dir):
    engine = load(tiny_model_dir, MILLM_BATCHING=request.param, MILLM_PREFILL_CHUNK="5", MILLM_PREFIX_CACHE_MB="0")
    yield engine
    engine.close()


@pytest.mark.parametrize("name", [None, "alpha", "beta"])
def test_generation_equals_peft_forward(engine, adapters, reference, name):
    adapter = adapters[name] if name else None
    for ids in PROMPTS[:2]:
        tokens, logprobs = generated(engine, ids, adapter)
        want_tokens, want_logprobs = greedy(reference[name], ids, 6)
        assert tokens == want_tokens
        assert logprobs == pytest.approx(want_logprobs, abs=1e-4)
    if name is not None:  # the adapter changes what the model computes
        assert greedy(reference[name], PROMPTS[0], 6)[1] != pytest.approx(greedy(reference[None], PROMPTS[0], 6)[1])


def test_a_mixed_batch_gives_each_row_what_it_gets_alone(tiny_model_dir, adapters):
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_PREFILL_CHUNK="5", MILLM_PREFIX_CACHE_MB="0")
    try:
        jobs = [(ids, adapter) for ids in PROMPTS for adapter in (None, adapters["alpha"], adapters["beta"])]
        alone = [generated(engine, ids, adapter, steps=8) for ids, adapter in jobs]
        results: list = [None] * len(jobs)
        start = threading.Barrier(len(jobs))

        def work(index, ids, adapter):
            start.wait()
            results[index] = generated(engine, ids, adapter, steps=8)

        threads = [threading.Thread(target=work, args=(i, *job)) for i, job in enumerate(jobs)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert engine.batch is not None and engine.batch.steps > 0
        for (tokens, logprobs), (want_tokens, want_logprobs) in zip(results, alone, strict=True):
            assert tokens == want_tokens
            assert logprobs == pytest.approx(want_logprobs, abs=1e-4)
    finally:
        engine.close()


@pytest.mark.parametrize("precision", ["native", "float32"])
def test_scoring_and_embeddings_apply_the_adapter(engine, adapters, reference, precision):
    ids = PROMPTS[0]
    for name in (None, "alpha"):
        adapter = adapters[name] if name else None
        scores = served(adapter, engine.score_next_token, [ids], ScoringParams(top=3, precision=precision))[0]
        with torch.no_grad():
            logits = reference[name](input_ids=torch.tensor([ids])).logits[0, -1].float()
        want = torch.log_softmax(logits, -1)
        assert scores.chosen.token_id == int(want.argmax())
        assert scores.chosen.logprob == pytest.approx(float(want.max()), abs=1e-4)
    prompt = served(adapters["alpha"], engine.score_prompt, [ids], 0)[0]
    with torch.no_grad():
        all_logits = reference["alpha"](input_ids=torch.tensor([ids])).logits[0].float()
    want = torch.log_softmax(all_logits, -1)
    assert [p.token.logprob for p in prompt] == pytest.approx(
        [float(want[i, ids[i + 1]]) for i in range(len(ids) - 1)], abs=1e-4
    )
    assert served(adapters["alpha"], engine.embed, ids) != pytest.approx(served(None, engine.embed, ids))


def _push(module, args, output):
    """A steering write on peft's side: +3 on a decoder layer's output."""
    return output + 3.0 if isinstance(output, torch.Tensor) else (output[0] + 3.0, *output[1:])


def test_hooks_read_and_steer_the_adapted_model_as_on_peft(engine, adapters, reference):
    layers, modules = engine.layers, list(engine.layers)
    read: list[torch.Tensor] = []
    hook = LayerHook(0, "resid_post", lambda hidden, start: read.append(hidden[0].clone()))
    params = SamplingParams(max_tokens=1, temperature=0)
    served(adapters["alpha"], lambda: run_hooked(engine, PROMPTS[0], params, [hook]))
    assert engine.layers is layers and list(engine.layers) == modules  # LoRA layers injected in place
    with torch.no_grad():
        states = reference["alpha"](input_ids=torch.tensor([PROMPTS[0]]), output_hidden_states=True).hidden_states
    prompt = torch.cat(read)[: len(PROMPTS[0])]  # the prompt's passes (chunks, in a batch) read its positions
    assert torch.allclose(prompt, states[1][0], atol=1e-5)  # layer 0's adapted output, as peft computes it

    push = LayerHook(0, "resid_post", lambda hidden, start: hidden + 3.0, order=100)
    steps = SamplingParams(max_tokens=5, temperature=0, logprobs=1)
    steered = served(adapters["alpha"], lambda: run_hooked(engine, PROMPTS[1], steps, [push]))
    peft_layers = reference["alpha"].base_model.model.model.layers
    handle = peft_layers[0].register_forward_hook(_push)
    try:
        want = greedy(reference["alpha"], PROMPTS[1], 5)
    finally:
        handle.remove()
    assert [int(t) for t in steered] == want[0]
    assert [t.logprob for t in steered] == pytest.approx(want[1], abs=1e-4)


def run_hooked(engine, ids, params, hooks) -> list:
    out = []
    tokens = engine.generate(ids, params, hooks=hooks)
    try:
        for token in tokens:
            out.append(token)
            if len(out) >= params.max_tokens:
                break
    finally:
        tokens.close()
    return out


def test_an_unload_waits_for_the_generations_using_the_adapter(tiny_model_dir, adapters):
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_PREFIX_CACHE_MB="0")
    try:
        alpha = adapters["alpha"]
        want = generated(engine, PROMPTS[0], alpha, steps=6)
        tokens = served(alpha, engine.generate, PROMPTS[0], SamplingParams(max_tokens=6, temperature=0, logprobs=1))
        first = [next(tokens)]
        engine.unload_adapter("alpha")
        assert "alpha" in engine.adapters.paths  # still generating with it
        first += list(tokens)
        tokens.close()
        assert ([int(t) for t in first], [t.logprob for t in first]) == (want[0], pytest.approx(want[1], abs=1e-4))
        engine.batch.call(lambda: None)  # the deferred unload ran between two steps
        assert "alpha" not in engine.adapters.paths
        base = generated(engine, PROMPTS[0], None)
        assert base != want
        assert generated(engine, PROMPTS[0], alpha) == (want[0], pytest.approx(want[1], abs=1e-4))  # back on use
    finally:
        engine.close()


def test_the_float32_scoring_copy_applies_the_served_adapter(tmp_path):
    """A bfloat16 model scored in float32: the copy's LoRA layers apply the request's adapter, as peft does."""
    import peft
    import transformers

    from millm_engine_transformers.engine import TransformersEngine
    from millm_engine_transformers.spec import describe
    from millm_host.settings import HOST_SETTINGS, Settings
    from millm_host.testing.tiny_models import tiny_llama

    path = tiny_llama("tiny-bf16", dtype="bfloat16", seed=3)
    adapter = LoraAdapter("tuned", str(make_adapter(path, tmp_path / "tuned", seed=4)), "tiny-bf16")
    settings = Settings(HOST_SETTINGS, {"MILLM_DTYPE": "bfloat16", "MILLM_DEVICE": "cpu"})
    engine = TransformersEngine.load(describe(str(path)), settings, lambda message: None)
    try:
        params = ScoringParams(top=3, precision="float32")
        [adapted] = served(adapter, engine.score_next_token, [PROMPTS[0]], params)
        [base] = served(None, engine.score_next_token, [PROMPTS[0]], params)
        stored = {n: p.dtype for n, p in engine.model.named_parameters() if "lora_" in n}
    finally:
        engine.close()
    # peft's forward in float32 on the weights the copy holds: bfloat16 ones (exact in float32), the adapter's as stored.
    reference = peft.PeftModel.from_pretrained(
        transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), adapter.path
    ).eval()
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            if "lora_" in name:
                kept = next(dtype for key, dtype in stored.items() if name.endswith(key.replace("tuned", "default")))
                parameter.copy_(parameter.to(kept).float())
        want = torch.log_softmax(reference(input_ids=torch.tensor([PROMPTS[0]])).logits[0, -1].float(), -1)
    assert adapted.chosen.token_id == int(want.argmax())
    assert adapted.chosen.logprob == pytest.approx(float(want.max()), abs=1e-4)
    assert [t.logprob for t in adapted.top] != pytest.approx([t.logprob for t in base.top], abs=1e-3)
