"""Steering on GGUF: additive vectors as llama.cpp control vectors, for one generation.

``control`` on its own (served points, refusals by name, per-layer sums), then the
engine as the server holds it (``ProcessEngine``): the vectors cross the wire with
GENERATE, steer that generation only, and never reach the KV cache of the next.
"""

from __future__ import annotations

import numpy as np
import pytest

from millm_engine_gguf import control
from millm_engine_gguf.process import ProcessEngine
from millm_engine_gguf.spec import describe
from millm_host.api import FieldNotHonoured, HookPoint, LayerHook, SamplingParams
from millm_host.testing.conformance import take

from .test_gguf_engine import settings

D_MODEL = 576  # SmolLM2-135M
N_LAYERS = 30
MESSAGES = [{"role": "user", "content": "Name a colour."}]
GREEDY = SamplingParams(max_tokens=8, temperature=0)


def add(layer: int, point: str, vector) -> LayerHook:
    return LayerHook(layer, point, lambda hidden, start: hidden + vector, 100, vector=lambda: vector)


def test_control_vectors_reach_the_output_of_layers_1_and_up():
    points = set(control.steering_points(N_LAYERS))
    assert HookPoint(1, "resid_post") in points and HookPoint(29, "resid_post") in points
    assert HookPoint(2, "resid_pre") in points and HookPoint(29, "resid_pre") in points
    for missing in (HookPoint(0, "resid_post"), HookPoint(0, "resid_pre"), HookPoint(1, "resid_pre")):
        assert missing not in points
    assert len(points) == 29 + 28


@pytest.mark.parametrize(("layer", "point"), [(0, "resid_post"), (1, "resid_pre"), (30, "resid_post")])
def test_a_point_no_control_vector_reaches_is_refused_by_name(layer, point):
    with pytest.raises(FieldNotHonoured) as caught:
        control.layer_vectors([add(layer, point, np.ones(D_MODEL))], N_LAYERS, D_MODEL)
    assert f"blocks.{layer}.hook_{point}" in caught.value.message
    assert "blocks.1..29.hook_resid_post" in caught.value.message


def test_a_hook_with_no_vector_is_refused():
    read = LayerHook(5, "resid_post", lambda hidden, start: None)
    with pytest.raises(FieldNotHonoured, match="additive steering vectors only"):
        control.layer_vectors([read], N_LAYERS, D_MODEL)


def test_vectors_are_summed_per_layer_and_resid_pre_lands_on_the_layer_before():
    a, b, c = (np.full(D_MODEL, v, dtype=np.float32) for v in (1.0, 2.0, 4.0))
    nothing = LayerHook(9, "resid_post", lambda hidden, start: hidden, 100, vector=lambda: None)
    vectors = control.layer_vectors(
        [add(5, "resid_post", a), add(6, "resid_pre", b), add(7, "resid_post", c), nothing], N_LAYERS, D_MODEL
    )
    assert sorted(vectors) == [5, 7]
    assert np.frombuffer(vectors[5], dtype=np.float32).tolist() == [3.0] * D_MODEL
    assert np.frombuffer(vectors[7], dtype=np.float32).tolist() == [4.0] * D_MODEL


@pytest.fixture(scope="module")
def engine(gguf_path):
    engine = ProcessEngine.load(
        describe(str(gguf_path)), settings(GGUF_N_CTX="256", GGUF_N_BATCH="128"), lambda _: None
    )
    yield engine
    engine.close()


def test_the_server_engine_offers_steering_points_but_no_hook_points(engine):
    assert engine.hook_points == ()
    assert set(engine.steering_points) == set(control.steering_points(N_LAYERS))


def test_a_steered_generation_changes_and_the_next_unsteered_one_is_as_before(engine):
    ids = engine.chat_ids(MESSAGES)
    plain = take(engine, ids, GREEDY, 8)
    vector = np.random.default_rng(0).standard_normal(D_MODEL).astype(np.float32) * 8
    hooks = [add(10, "resid_post", vector)]
    steered = list(engine.generate(ids, GREEDY, hooks=hooks))[:8]
    assert steered != plain
    # the same prompt again: the cached prefix was computed steered, so it is not reused
    assert take(engine, ids, GREEDY, 8) == plain
    # and a steered run after an unsteered one does not reuse the unsteered prefix either
    assert list(engine.generate(ids, GREEDY, hooks=hooks))[:8] == steered


def test_a_steered_generation_closed_early_leaves_nothing_applied(engine):
    ids = engine.chat_ids(MESSAGES)
    plain = take(engine, ids, GREEDY, 8)
    vector = np.full(D_MODEL, 6.0, dtype=np.float32)
    tokens = engine.generate(ids, SamplingParams(max_tokens=100, temperature=0), hooks=[add(3, "resid_post", vector)])
    next(tokens)
    tokens.close()
    assert take(engine, ids, GREEDY, 8) == plain


def test_a_wrong_sized_vector_fails_before_the_child_sees_it(engine):
    with pytest.raises(ValueError, match="hidden size is 576"):
        engine.generate([1, 2, 3], GREEDY, hooks=[add(3, "resid_post", np.ones(10))])
    assert take(engine, engine.chat_ids(MESSAGES), GREEDY, 2)
