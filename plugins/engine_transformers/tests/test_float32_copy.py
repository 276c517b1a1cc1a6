"""The float32 copy, in process: what cannot be copied is refused, and the served model is only read.

These reasons are hard to reach through a server on a CPU box (no bitsandbytes,
no GPU), so the engine is loaded here, from a real checkpoint, and the model is
changed the way such a model would differ: an integer parameter, a GGUF origin,
a structure deepcopy cannot rebuild.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from millm_engine_transformers.engine import TransformersEngine
from millm_engine_transformers.spec import describe
from millm_host.api import ScoringParams, ScoringPrecisionUnavailable
from millm_host.settings import HOST_SETTINGS, Settings
from millm_host.testing.tiny_models import tiny_llama

FLOAT32 = ScoringParams(top=3, precision="float32")
IDS = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def engine():
    settings = Settings(
        HOST_SETTINGS, {"MILLM_DTYPE": "bfloat16", "MILLM_DEVICE": "cpu"}
    )  # the engine declares its own
    path = tiny_llama("tiny-bf16", dtype="bfloat16", seed=3)
    return TransformersEngine.load(describe(str(path)), settings, lambda message: None)


def reason_of(engine) -> str:
    with pytest.raises(ScoringPrecisionUnavailable) as refused:
        engine.score_next_token([IDS], FLOAT32)
    assert refused.value.status == 409
    return refused.value.reason


def test_the_copy_is_float32_and_the_served_model_unchanged(engine):
    before = {name: p.detach().clone() for name, p in engine.model.named_parameters()}
    [result] = engine.score_next_token([IDS], FLOAT32)
    for name, p in engine.model.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, before[name]), name
    reference = engine.model.to(torch.float32)  # bfloat16 -> float32 -> bfloat16 is lossless
    try:
        with torch.inference_mode():
            expected = torch.log_softmax(reference(torch.tensor([IDS])).logits[0, -1].float(), -1)
    finally:
        engine.model.to(torch.bfloat16)
    assert result.chosen.logprob == pytest.approx(float(expected.max()), abs=1e-5)


def test_integer_parameters_are_not_castable(engine):
    engine.model.register_parameter("step", torch.nn.Parameter(torch.zeros(1, dtype=torch.int64), requires_grad=False))
    try:
        assert reason_of(engine) == "model_not_float32_castable"
    finally:
        del engine.model.step


def test_a_gguf_model_is_not_castable(engine):
    served = engine.descriptor
    engine.descriptor = dataclasses.replace(served, format="gguf")
    try:
        assert reason_of(engine) == "model_not_float32_castable"
    finally:
        engine.descriptor = served


def test_a_structure_that_cannot_be_rebuilt_is_not_castable(engine):
    engine.model.model.norm.guard = threading.Lock()  # deepcopy cannot copy a lock
    try:
        assert reason_of(engine) == "model_not_float32_castable"
    finally:
        del engine.model.model.norm.guard
    assert engine.score_next_token([IDS], FLOAT32)[0].chosen.logprob < 0  # served as before
