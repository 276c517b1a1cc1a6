"""The engine conformance suite: what every engine must do, checked the same way.

An engine plugin's tests subclass ``EngineConformance`` and provide an ``engine``
fixture (a loaded ``Engine``, module- or class-scoped)::

    class TestMyEngine(EngineConformance):
        @pytest.fixture(scope="class")
        def engine(self): ...

Class attributes say what the engine offers (``supports_seed``,
``supports_embeddings`` with its ``poolings``, ``supports_scoring``); layer hooks are checked when ``engine.hook_points`` is
not empty.
"""

from __future__ import annotations

import math
import re

import pytest

from ..engine import LayerHook, SamplingParams
from ..scoring.engine import ScoringParams

MESSAGES = [{"role": "user", "content": "Say something."}]


def take(engine, ids, params, n, **kwargs) -> list[int]:
    tokens = engine.generate(ids, params, **kwargs)
    try:
        return [next(tokens) for _ in range(n)]
    finally:
        tokens.close()


class EngineConformance:
    supports_seed = True
    supports_embeddings = True
    poolings: tuple[str, ...] = ("mean",)
    supports_scoring = False  # optional: Engine.score_next_token and Engine.score_prompt
    #: How far ``score_prompt``'s logprob of a token may be from scoring its prefix alone (one pass over the
    #: whole prompt against one over the prefix: the same math on other shapes).
    prompt_atol = 1e-5

    def test_info_is_complete(self, engine):
        info = engine.info
        assert info.id and info.engine == engine.name
        assert info.vocab_size > 0 and info.eos_token_ids
        assert info.context_window is None or info.context_window > 0
        assert re.fullmatch(r"millm:[^@]+@[^:]+:[^/]+/[^:]+:" + re.escape(engine.name), info.system_fingerprint)

    def test_tokenize_decode_round_trip(self, engine):
        text = "Hello, world! 123"
        ids = engine.tokenize(text, add_special_tokens=False)
        assert ids and all(isinstance(i, int) for i in ids)
        assert engine.decode(ids) == text

    def test_chat_ids_have_at_most_one_bos(self, engine):
        ids = engine.chat_ids(MESSAGES)
        bos = engine.info.bos_token_id
        if bos is not None:
            assert ids[:2] != [bos, bos]

    def test_greedy_generation_is_deterministic(self, engine):
        ids = engine.chat_ids(MESSAGES)
        params = SamplingParams(max_tokens=8, temperature=0)
        assert take(engine, ids, params, 8) == take(engine, ids, params, 8)

    def test_seeded_sampling_is_reproducible(self, engine):
        if not self.supports_seed:
            pytest.skip("this engine does not honour seeds")
        ids = engine.chat_ids(MESSAGES)
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=42)
        assert take(engine, ids, params, 8) == take(engine, ids, params, 8)

    def test_closing_a_generation_early_leaves_the_engine_usable(self, engine):
        ids = engine.chat_ids(MESSAGES)
        params = SamplingParams(max_tokens=4, temperature=0)
        first = take(engine, ids, params, 2)
        assert take(engine, ids, params, 4)[:2] == first

    def test_layer_hooks_see_every_position_once(self, engine):
        if not engine.hook_points:
            pytest.skip("this engine has no layer hooks")
        ids = engine.chat_ids(MESSAGES)
        seen: list[tuple[int, int]] = []
        hook = LayerHook(0, "resid_post", lambda hidden, start: seen.append((start, hidden.shape[1])))
        take(engine, ids, SamplingParams(max_tokens=3, temperature=0), 3, hooks=[hook])
        assert seen[0] == (0, len(ids))
        assert seen[1:] == [(len(ids), 1), (len(ids) + 1, 1)]
        seen.clear()
        take(engine, ids, SamplingParams(max_tokens=2, temperature=0), 2)
        assert seen == []  # removed after the call

    def test_embeddings(self, engine):
        if not self.supports_embeddings:
            pytest.skip("this engine does not embed")
        ids = engine.tokenize("a sentence to embed")
        vector = engine.embed(ids, "mean")
        assert len(vector) > 0 and all(isinstance(v, float) for v in vector)
        assert engine.embed(ids, "mean") == vector

    def test_scoring(self, engine):
        if not self.supports_scoring:
            pytest.skip("this engine does not score")
        ids = engine.tokenize("The capital of France is")
        [full] = engine.score_next_token([ids], ScoringParams(top=3))
        assert full.chosen == full.top[0] and len(full.top) == 3
        assert all(a.logprob >= b.logprob for a, b in zip(full.top, full.top[1:], strict=False))
        assert full.chosen.token_id == take(engine, ids, SamplingParams(max_tokens=1, temperature=0), 1)[0]
        allowed = tuple(t.token_id for t in full.top[1:])
        [subset] = engine.score_next_token([ids], ScoringParams(top=5, allowed_token_ids=allowed))
        assert {t.token_id for t in subset.top} == set(allowed)
        assert math.fsum(math.exp(t.logprob) for t in subset.top) == pytest.approx(1.0, abs=1e-6)

    def test_prompt_scores_are_the_next_token_scores_of_each_prefix(self, engine):
        if not self.supports_scoring:
            pytest.skip("this engine does not score")
        ids = engine.tokenize("The capital of France is Paris, and")
        [rows] = engine.score_prompt([ids], 3)
        assert [row.token.token_id for row in rows] == ids[1:]
        for position, row in enumerate(rows, start=1):
            [alone] = engine.score_next_token([ids[:position]], ScoringParams(top=3))
            assert [t.token_id for t in row.top] == [t.token_id for t in alone.top]
            assert [t.logprob for t in row.top] == pytest.approx([t.logprob for t in alone.top], abs=self.prompt_atol)
            assert row.rank >= 1 and (row.rank == 1) == (row.token.token_id == alone.chosen.token_id)
            if row.rank <= 3:
                assert row.token == row.top[row.rank - 1]

    def test_embeddings_pool_and_are_unhooked(self, engine):
        if not self.supports_embeddings:
            pytest.skip("this engine does not embed")
        ids = engine.tokenize("a sentence to embed")
        vectors = {pooling: engine.embed(ids, pooling) for pooling in self.poolings}
        assert len({tuple(v) for v in vectors.values()}) == len(self.poolings), "each pooling differs"
        if engine.hook_points:
            point = engine.hook_points[0]
            hook = LayerHook(point.layer, point.point, lambda hidden, start: hidden * 0, order=0)
            take(engine, ids, SamplingParams(max_tokens=1, temperature=0), 1, hooks=[hook])
            assert engine.embed(ids, "mean") == vectors["mean"], "a generation's hooks never reach an embedding"
