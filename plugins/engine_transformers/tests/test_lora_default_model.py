"""A LoRA adapter on the default model (SmolLM2-135M-Instruct, float32), against peft's own forward.

The adapter is built with ``peft`` on a copy of the engine's own model (random nonzero
``lora_B`` on the attention and MLP projections) and saved; served through the continuous
batch beside a base row, each gives what ``PeftModel`` and the plain model give.
"""

from __future__ import annotations

import copy
import threading

import pytest

from millm_host.api import LoraAdapter, SamplingParams

from .test_batching_default_model import load
from .test_lora import greedy, randomize_lora_b, served

pytestmark = pytest.mark.slow


def test_an_adapted_row_beside_a_base_row_equals_peft(tmp_path):
    import peft

    engine = load(MILLM_BATCHING="continuous", MILLM_PREFIX_CACHE_MB="0")
    try:
        reference = peft.get_peft_model(  # on a copy: the engine's model stays as it was loaded
            copy.deepcopy(engine.model),
            peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]),
        )
        randomize_lora_b(reference, seed=5, scale=0.05)
        reference.save_pretrained(tmp_path / "tuned")
        reference.eval()
        adapter = LoraAdapter("tuned", str(tmp_path / "tuned"), "default")
        ids = engine.tokenize("The capital of France is")
        params = SamplingParams(max_tokens=6, temperature=0, logprobs=1)
        results: dict = {}

        def run_to_end(key, which):
            tokens = served(which, engine.generate, ids, params)
            out = []
            try:
                for token in tokens:
                    out.append(token)
                    if len(out) >= params.max_tokens:
                        break
            finally:
                tokens.close()
            results[key] = out

        threads = [threading.Thread(target=run_to_end, args=key) for key in (("base", None), ("tuned", adapter))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for key in ("base", "tuned"):
            if key == "base":
                with reference.disable_adapter():
                    want_tokens, want_logprobs = greedy(reference, ids, 6)
            else:
                want_tokens, want_logprobs = greedy(reference, ids, 6)
            assert [int(t) for t in results[key]] == want_tokens, key
            assert [t.logprob for t in results[key]] == pytest.approx(want_logprobs, abs=1e-4), key
        assert results["base"] != results["tuned"] or [t.logprob for t in results["base"]] != pytest.approx(
            [t.logprob for t in results["tuned"]], abs=1e-4
        )
    finally:
        engine.close()
