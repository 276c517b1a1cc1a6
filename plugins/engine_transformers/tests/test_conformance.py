"""The shared engine conformance suite on the transformers engine (a tiny model)."""

from __future__ import annotations

import pytest

from millm_host.api import LayerHook, ModelDescriptor, SamplingParams, Settings
from millm_host.testing.conformance import EngineConformance, take


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    from millm_engine_transformers.engine import TransformersEngine

    descriptor = ModelDescriptor(id="tiny", path=str(tiny_model_dir), format="hf", engine="transformers")
    engine = TransformersEngine.load(descriptor, Settings(environ={}), lambda message: None)
    yield engine
    engine.close()


class TestTransformersEngine(EngineConformance):
    poolings = ("mean", "last", "cls")
    supports_scoring = True

    @pytest.fixture
    def engine(self, loaded):
        return loaded


def test_write_hooks_run_in_order_and_change_the_residual(loaded):
    import torch

    ids = loaded.chat_ids([{"role": "user", "content": "hi"}])
    order: list[str] = []
    captured: dict[str, torch.Tensor] = {}

    def read(name):
        def callback(hidden, start):
            order.append(name)
            captured[name] = hidden.clone()

        return callback

    def write(hidden, start):
        order.append("write")
        return hidden + 1.0

    hooks = [
        LayerHook(0, "resid_post", read("post"), order=200),
        LayerHook(0, "resid_post", write, order=100),
        LayerHook(0, "resid_post", read("pre"), order=0),
        LayerHook(1, "resid_pre", read("next_layer_input"), order=0),
    ]
    take(loaded, ids, SamplingParams(max_tokens=1, temperature=0), 1, hooks=hooks)
    assert order[:4] == ["pre", "write", "post", "next_layer_input"]
    assert torch.allclose(captured["post"], captured["pre"] + 1.0)
    assert torch.allclose(captured["next_layer_input"], captured["post"])


def test_resid_pre_of_a_layer_is_the_previous_layers_output(loaded, tiny_model_dir):
    import torch
    import transformers

    ids = loaded.chat_ids([{"role": "user", "content": "hello"}])
    seen = {}
    loaded.forward(
        ids,
        hooks=[
            LayerHook(1, "resid_pre", lambda h, s: seen.setdefault("pre1", h.clone())),
            LayerHook(0, "resid_post", lambda h, s: seen.setdefault("post0", h.clone())),
        ],
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    # hidden_states[i + 1] is the output of decoder layer i.
    assert torch.allclose(seen["post0"], hidden[1], atol=1e-5)
    assert torch.allclose(seen["pre1"], hidden[1], atol=1e-5)
