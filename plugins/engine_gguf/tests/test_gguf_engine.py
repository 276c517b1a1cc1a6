"""The GGUF engine called directly: tokens, template, generation edges, embeddings, request checks.

The HTTP ``/v1/embeddings`` route lives in the host; here ``GGUFEngine.embed``
is checked against llama-cpp-python's own ``Llama.embed`` on the same file.
"""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from millm_engine_gguf import plugin
from millm_engine_gguf.engine import GGUFEngine
from millm_engine_gguf.settings import SETTINGS
from millm_engine_gguf.spec import describe
from millm_host.api import (
    ContextLengthExceeded,
    FieldNotHonoured,
    InvalidParameter,
    LayerHook,
    RequestContext,
    SamplingParams,
)
from millm_host.settings import HOST_SETTINGS, Settings
from millm_host.testing.conformance import EngineConformance

from .conftest import THREADS, embedding_llama

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog. " * 8, "<|im_start|>user\nhi<|im_end|>"]


def settings(**environ: str) -> Settings:
    return Settings((*HOST_SETTINGS, *SETTINGS), environ={**THREADS, **environ})


@pytest.fixture(scope="module")
def engine(gguf_path):
    engine = GGUFEngine.load(describe(str(gguf_path)), settings(GGUF_N_CTX="256", GGUF_N_BATCH="128"), lambda _: None)
    yield engine
    engine.close()


def greedy(engine, ids, count):
    tokens = engine.generate(ids, SamplingParams(max_tokens=count, temperature=0))
    try:
        return [next(tokens) for _ in range(count)]
    finally:
        tokens.close()


def test_model_info(engine, reference_llama):
    info = engine.info
    assert (info.engine, info.context_window, info.quantization) == ("gguf", 256, "Q4_1")
    assert (info.vocab_size, info.d_model, info.n_layers) == (49152, 576, 30)
    assert (info.bos_token, info.bos_token_id) == ("<|im_start|>", 1)
    assert reference_llama.token_eos() in info.eos_token_ids
    assert info.chat_template == reference_llama.metadata["tokenizer.chat_template"]
    assert engine.hook_points == ()
    assert engine.embedding_window == 128


def test_tokenize_parses_special_tokens_and_decode_skips_them(engine, reference_llama):
    text = "<|im_start|>user\nhéllo 世界<|im_end|>"
    ids = engine.tokenize(text)
    assert ids == reference_llama.tokenize(text.encode(), add_bos=True, special=True)
    assert ids[0] == 1 and ids[-1] == 2
    assert engine.decode(ids) == "user\nhéllo 世界"
    assert engine.token_bytes(1) == b"<|im_start|>"
    with pytest.raises(InvalidParameter):
        engine.tokenize("lone \ud800 surrogate")
    with pytest.raises(InvalidParameter):
        engine.decode([49152])


def test_render_chat_is_llama_cpp_pythons_prompt(engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert engine.render_chat(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert engine.render_chat(messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    # A tool-call turn carries no content; the template still renders.
    assert "<|im_start|>assistant\n<|im_end|>" in engine.render_chat(
        [*messages, {"role": "assistant", "content": None}]
    )
    with pytest.raises(FieldNotHonoured):
        engine.render_chat(messages, tools=[{"type": "function", "function": {"name": "f"}}])


def test_a_template_that_refuses_the_messages_is_a_400(engine):
    from millm_engine_gguf.chat import ChatTemplate

    strict = ChatTemplate("{{ raise_exception('roles must alternate') }}", "<s>", "</s>")
    with pytest.raises(InvalidParameter) as caught:
        strict.render([{"role": "user", "content": "x"}], True)
    assert caught.value.param == "messages" and "roles must alternate" in caught.value.message


def test_closing_a_generation_leaves_the_engine_consistent(engine):
    prompt = engine.chat_ids([{"role": "user", "content": "Count to ten."}])
    full = greedy(engine, prompt, 12)
    assert greedy(engine, prompt, 3) == full[:3]  # closed after three tokens
    other = engine.chat_ids([{"role": "user", "content": "Name a fruit."}])
    greedy(engine, other, 5)
    assert greedy(engine, prompt, 12) == full


def test_generation_stops_at_the_context_window(engine):
    prompt = engine.tokenize(" apple" * 250)
    assert len(prompt) == 250
    tokens = list(engine.generate(prompt, SamplingParams(max_tokens=100, temperature=0)))
    assert len(tokens) == 256 - 250
    with pytest.raises(ContextLengthExceeded):
        engine.generate(engine.tokenize(" apple" * 256), SamplingParams(max_tokens=1, temperature=0))


def test_hooks_are_refused_never_dropped(engine):
    hook = LayerHook(layer=0, point="resid_post", callback=lambda hidden, start: None)
    with pytest.raises(FieldNotHonoured):
        engine.generate([1, 2, 3], SamplingParams(max_tokens=1), hooks=[hook])
    with pytest.raises(FieldNotHonoured):
        engine.generate([1, 2, 3], SamplingParams(max_tokens=1), logits_processors=[lambda ids, logits: logits])
    with pytest.raises(FieldNotHonoured):
        engine.forward([1, 2, 3])


@pytest.mark.parametrize("text", TEXTS, ids=["short", "long", "special"])
def test_embed_equals_llama_cpp_mean_pooling(engine, reference_embedder, text):
    expected = np.array(reference_embedder.embed(text))
    ids = reference_embedder.tokenize(text.encode())  # Llama.embed's own ids (special text not parsed)
    got = np.array(engine.embed(ids, "mean"))
    assert got.shape == (576,)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_embedding_is_the_mean_over_every_position(engine, gguf_path):
    per_token = embedding_llama(gguf_path, llama_cpp.LLAMA_POOLING_TYPE_NONE)
    try:
        expected = np.mean(np.array(per_token.embed(TEXTS[1])), axis=0)
    finally:
        per_token.close()
    np.testing.assert_allclose(engine.embed(engine.tokenize(TEXTS[1])), expected, rtol=1e-4, atol=1e-4)


def test_embed_refusals(engine, gguf_path):
    with pytest.raises(FieldNotHonoured) as caught:
        engine.embed([1, 2], "last")
    assert caught.value.param == "pooling"
    with pytest.raises(ContextLengthExceeded) as caught:
        engine.embed([28120] * 129)
    assert caught.value.param == "input" and "128" in caught.value.message
    off = GGUFEngine.load(describe(str(gguf_path)), settings(GGUF_ENABLE_EMBEDDINGS="false"), lambda _: None)
    try:
        with pytest.raises(FieldNotHonoured) as caught:
            off.embed([1, 2])
        assert "GGUF_ENABLE_EMBEDDINGS" in caught.value.message
    finally:
        off.close()


def embeddings_context(gguf_path, body, **environ) -> RequestContext:
    return RequestContext(
        endpoint="embeddings",
        body=body,
        params=None,
        headers={},
        model=describe(str(gguf_path)),
        engine_name="gguf",
        settings=settings(**environ),
    )


@pytest.mark.parametrize("pooling", ["last", "cls"])
def test_validate_request_refuses_last_and_cls_pooling(gguf_path, pooling):
    with pytest.raises(FieldNotHonoured) as caught:
        plugin.validate_request(embeddings_context(gguf_path, {"input": "x", "pooling": pooling}))
    assert caught.value.param == "pooling"


def test_validate_request_accepts_mean_and_names_the_disabling_setting(gguf_path):
    plugin.validate_request(embeddings_context(gguf_path, {"input": "x", "pooling": "mean", "normalize": True}))
    plugin.validate_request(embeddings_context(gguf_path, {"input": "x"}))
    with pytest.raises(FieldNotHonoured) as caught:
        plugin.validate_request(embeddings_context(gguf_path, {"input": "x"}, GGUF_ENABLE_EMBEDDINGS="false"))
    assert "GGUF_ENABLE_EMBEDDINGS" in caught.value.message


class TestGGUFEngineConformance(EngineConformance):
    """The shared engine conformance suite (seeds are refused on GGUF until measured)."""

    supports_seed = False

    @pytest.fixture
    def engine(self, engine):
        return engine
