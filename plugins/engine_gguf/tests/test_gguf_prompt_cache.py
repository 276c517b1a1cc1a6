"""Prompt reuse: a generation starts from the longest prefix of its prompt the KV cache holds (``prefix``).

On the serial path (``GGUF_PARALLEL=1``) and the batch path (a free slot's cells), each
case against the same prompt decoded cold (the in-process engine with its cache emptied):
the greedy tokens are equal and ``cached_tokens`` says how much was reused. Then
``usage.prompt_tokens_details.cached_tokens`` through the server.
"""

from __future__ import annotations

import pytest

from millm_engine_gguf.engine import GGUFEngine
from millm_engine_gguf.prefix import chunk, common_prefix
from millm_engine_gguf.process import ProcessEngine
from millm_engine_gguf.spec import describe
from millm_host.engine import SamplingParams
from millm_host.testing.conformance import take

from .conftest import DEFAULT_ID
from .test_gguf_engine import settings

TOKENS = 12
GREEDY = SamplingParams(max_tokens=TOKENS, temperature=0)
OPTIONS = {"GGUF_N_CTX": "256", "GGUF_N_BATCH": "128"}


@pytest.fixture(scope="module", params=["1", "2"], ids=["serial", "batch"])
def engine(request, gguf_path):
    engine = ProcessEngine.load(
        describe(str(gguf_path)), settings(GGUF_PARALLEL=request.param, **OPTIONS), lambda _: None
    )
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def cold(gguf_path):
    """``cold(ids)``: the greedy tokens of ``ids`` with nothing cached."""
    reference = GGUFEngine.load(describe(str(gguf_path)), settings(**OPTIONS), lambda _: None)

    def generate(ids: list[int]) -> list[int]:
        reference.llm.reset()
        return take(reference, ids, GREEDY, TOKENS)

    yield generate
    reference.close()


def run(engine, ids: list[int]) -> tuple[list[int], int | None]:
    """The greedy tokens of ``ids`` and the prompt tokens the engine said it reused."""
    tokens = engine.generate(ids, GREEDY)
    try:
        return [next(tokens) for _ in range(TOKENS)], tokens.cached_tokens
    finally:
        tokens.close()


def chat(engine, text: str) -> list[int]:
    return engine.chat_ids([{"role": "user", "content": text}])


def test_the_same_prompt_again_reuses_all_but_its_last_two_tokens(engine, cold):
    ids = chat(engine, "Name three rivers in Europe.")
    first, _ = run(engine, ids)
    again, cached = run(engine, ids)
    assert cached == len(ids) - 2
    assert first == again == cold(ids)


def test_a_shared_prefix_with_another_tail_reuses_the_prefix(engine, cold):
    a, b = chat(engine, "Describe a cat in one sentence."), chat(engine, "Describe a dog in one sentence.")
    run(engine, a)
    tokens, cached = run(engine, b)
    assert 0 < cached == common_prefix(a, b) < len(b) - 2
    assert tokens == cold(b)


def test_a_cached_prompt_longer_than_the_new_one_gives_the_new_ones_prefix(engine, cold):
    long = chat(engine, "List the planets of the solar system in order from the sun.")
    short = long[: len(long) - 9]
    run(engine, long)
    tokens, cached = run(engine, short)
    assert cached == len(short) - 2
    assert tokens == cold(short)


def test_a_reply_is_decoded_again_not_reused(engine, cold):
    """A generated token's cells were written by a one-token decode, which rounds apart from a prompt's."""
    ids = chat(engine, "Say something about the sea.")
    reply, _ = run(engine, ids)
    follow = ids + reply + chat(engine, "And the mountains?")[-8:]
    tokens, cached = run(engine, follow)
    assert cached == len(ids)
    assert tokens == cold(follow)


def test_prompts_are_decoded_in_chunks_of_two_tokens_at_least():
    assert [chunk(5, 128, 128), chunk(129, 128, 128), chunk(1, 128, 128)] == [5, 127, 1]
    assert [chunk(3, 2, 128), chunk(4, 3, 128), chunk(2, 1, 128)] == [0, 2, 0]
    assert chunk(3, 2, 2) == 2  # a batch of two cannot keep the rule


@pytest.mark.parametrize("stream", [False, True])
def test_usage_reports_the_cached_prompt_tokens(gguf_server, stream):
    client = gguf_server.openai()
    kwargs = dict(model=DEFAULT_ID, messages=[{"role": "user", "content": f"Pick a colour ({stream})."}], max_tokens=2)

    def usage():
        if not stream:
            return client.chat.completions.create(temperature=0, **kwargs).usage
        chunks = client.chat.completions.create(
            temperature=0, stream=True, stream_options={"include_usage": True}, **kwargs
        )
        return [c.usage for c in chunks][-1]

    first, second = usage(), usage()
    assert first.prompt_tokens_details.cached_tokens < first.prompt_tokens - 2
    assert second.prompt_tokens_details.cached_tokens == second.prompt_tokens - 2


def test_the_responses_api_reports_the_cached_input_tokens(gguf_server):
    client = gguf_server.openai()

    def usage():
        return client.responses.create(
            model=DEFAULT_ID, input="Name a river.", max_output_tokens=2, temperature=0
        ).usage

    first, second = usage(), usage()
    assert first.input_tokens_details.cached_tokens < first.input_tokens - 2
    assert second.input_tokens_details.cached_tokens == second.input_tokens - 2
