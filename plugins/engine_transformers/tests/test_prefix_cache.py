"""Automatic prefix caching in the continuous batch, on a tiny random Llama.

A prompt that starts with one computed before reuses its keys and values, and
computes what a cold run computes: greedy tokens equal, log-probabilities and the
residuals read hooks see within 1e-4, every position read once. Writes that differ
(another steering vector) or hooks that give no key reuse nothing; memory stays
within its bound, least recently used out first.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from millm_host.api import READS_PROMPT, LayerHook, SamplingParams

from .test_batching import load

BASE = "system: you are a careful assistant who answers in words " * 6


@pytest.fixture(scope="module")
def warm(tiny_model_dir):
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_PREFILL_CHUNK="16", MILLM_PREFIX_CACHE_MB="64")
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def cold(tiny_model_dir):
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_PREFILL_CHUNK="16", MILLM_PREFIX_CACHE_MB="0")
    yield engine
    engine.close()


GREEDY = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)


def generate(engine, ids, hooks=(), params=GREEDY):
    """(tokens, logprobs, cached_tokens) of one generation."""
    tokens = engine.generate(ids, params, hooks=list(hooks))
    try:
        out = list(tokens)
    finally:
        tokens.close()
    return [int(t) for t in out], [t.logprob for t in out], getattr(tokens, "cached_tokens", None)


class Reads:
    """A read hook at layer 1 that keeps what it saw by position (and how often each was seen)."""

    def __init__(self, key=READS_PROMPT, order=0):
        self.seen: dict[int, torch.Tensor] = {}
        self.counts: dict[int, int] = {}
        self.hook = LayerHook(1, "resid_post", self.read, order, owner="test", prompt_key=key)

    def read(self, hidden, start):
        for offset in range(hidden.shape[1]):
            self.seen[start + offset] = hidden[0, offset].clone()
            self.counts[start + offset] = self.counts.get(start + offset, 0) + 1


def write(key, scale=0.5, d=None):
    """A write at layer 0 adding ``scale`` at every position, whose prompt key is ``key``."""
    return LayerHook(0, "resid_post", lambda hidden, start: hidden + scale, 100, owner="test", prompt_key=key)


def test_a_longer_prompt_reuses_a_shorter_ones_prefix_and_computes_what_a_cold_run_does(warm, cold):
    first = warm.tokenize(BASE + "first question")
    second = warm.tokenize(BASE + "a second, rather different question about words")
    generate(warm, first)
    tokens, logprobs, cached = generate(warm, second)
    shared = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert cached == shared  # every token the two prompts share, block matched then token by token
    cold_tokens, cold_logprobs, cold_cached = generate(cold, second)
    assert cold_cached == 0
    assert tokens == cold_tokens
    assert max(abs(a - b) for a, b in zip(logprobs, cold_logprobs, strict=True)) < 1e-4


def test_the_same_prompt_again_computes_only_its_last_token(warm):
    ids = warm.tokenize(BASE + "the same prompt twice")
    once = generate(warm, ids)
    again = generate(warm, ids)
    assert again[2] == len(ids) - 1 and again[0] == once[0]


def test_reads_see_every_position_once_as_a_cold_run_computed_it(warm, cold):
    ids = warm.tokenize(BASE + "monitored turn")
    generate(warm, warm.tokenize(BASE + "an earlier turn"), [Reads().hook])  # stores the residuals reads saw
    reads = Reads()
    _, _, cached = generate(warm, ids, [reads.hook])
    assert cached and cached > 16
    baseline = Reads()
    generate(cold, ids, [baseline.hook])
    assert sorted(reads.seen) == sorted(baseline.seen)
    assert set(reads.counts.values()) == {1}
    worst = max(float((reads.seen[p] - baseline.seen[p]).abs().max()) for p in baseline.seen)
    assert worst < 1e-4


def test_a_prompt_stored_without_a_reads_residual_is_not_reused_by_that_read(warm):
    ids = warm.tokenize(BASE + "read at another order")
    generate(warm, warm.tokenize(BASE + "stored with no reads at all"))
    reads = Reads(order=200)  # a tap no stored prompt has yet
    _, _, cached = generate(warm, ids, [reads.hook])
    assert cached == 0 and min(reads.seen) == 0
    again = Reads(order=200)
    _, _, cached = generate(warm, warm.tokenize(BASE + "read at another order, again"), [again.hook])
    assert cached > 16  # the first one stored what a read at its order saw


def test_writes_are_part_of_the_key(warm, cold):
    ids = warm.tokenize(BASE + "steered this way")
    generate(warm, warm.tokenize(BASE + "steered before"), [write("vector-a")])
    _, _, cached = generate(warm, ids, [write("vector-b", scale=-0.5)])
    assert cached == 0  # another vector: another key
    tokens, logprobs, cached = generate(warm, warm.tokenize(BASE + "steered again"), [write("vector-a")])
    assert cached > 16
    cold_tokens, cold_logprobs, _ = generate(cold, warm.tokenize(BASE + "steered again"), [write("vector-a")])
    assert tokens == cold_tokens
    assert max(abs(a - b) for a, b in zip(logprobs, cold_logprobs, strict=True)) < 1e-4
    only_steered = warm.tokenize("a prompt only ever steered " * 6)
    generate(warm, only_steered, [write("vector-a")])
    _, _, cached = generate(warm, only_steered)  # unsteered never reuses a steered prompt
    assert cached == 0


def test_a_hook_without_a_key_reuses_and_stores_nothing(warm):
    ids = warm.tokenize(BASE + "a hook that must see everything")
    generate(warm, ids)
    reads = Reads(key=None)
    _, _, cached = generate(warm, ids, [reads.hook])
    assert cached == 0 and sorted(reads.seen) == list(range(len(ids) + GREEDY.max_tokens - 1))


def test_rows_reusing_prefixes_beside_cold_rows_compute_what_they_would_alone(warm, cold):
    prompts = [warm.tokenize(BASE + f"question number {i} " + "word " * i) for i in range(6)]
    generate(warm, prompts[0])
    results: list = [None] * len(prompts)

    def work(index):
        results[index] = generate(warm, prompts[index])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for prompt, (tokens, logprobs, cached) in zip(prompts, results, strict=True):
        assert cached > 16
        cold_tokens, cold_logprobs, _ = generate(cold, prompt)
        assert tokens == cold_tokens
        assert max(abs(a - b) for a, b in zip(logprobs, cold_logprobs, strict=True)) < 1e-4


def together(engine, prompt, count):
    """``count`` generations of ``prompt``, each with its own read, admitted in one step (the model is
    held until all of them wait): (results, reads)."""
    reads = [Reads() for _ in range(count)]
    results: list = [None] * count

    def work(index):
        results[index] = generate(engine, prompt, hooks=[reads[index].hook])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    with engine.batch.held():
        for thread in threads:
            thread.start()
        while engine.batch.waiting < count:
            time.sleep(0.01)
    for thread in threads:
        thread.join()
    return results, reads


def test_twins_arriving_together_compute_their_prompt_once(warm, cold):
    """Four generations of one new prompt under one key (``n`` choices; both replies of ``with_unsteered``
    where nothing steers) start together: one prefills, the others wait for it and reuse all of its
    prompt but the last token, and each computes what it would alone. A read's key is shared too."""
    prompt = warm.tokenize(BASE + "twins share this prompt, which nothing before has started with")
    results, reads = together(warm, prompt, 4)
    cold_tokens, cold_logprobs, _ = generate(cold, prompt)
    assert sorted(cached for _, _, cached in results) == [0, *[len(prompt) - 1] * 3]
    for read, (tokens, logprobs, _) in zip(reads, results, strict=True):
        assert tokens == cold_tokens
        assert max(abs(a - b) for a, b in zip(logprobs, cold_logprobs, strict=True)) < 1e-4
        assert set(read.counts) >= set(range(len(prompt))) and all(read.counts[i] == 1 for i in range(len(prompt)))


def test_twins_whose_prompt_the_cache_cannot_keep_prefill_together(tiny_model_dir, cold):
    """A twin waits only for a prefill it can reuse: a prompt larger than the cache is not kept, so
    twins of it share one prefill instead of computing it one after the other."""
    engine = load(tiny_model_dir, MILLM_BATCHING="continuous", MILLM_PREFILL_CHUNK="16", MILLM_PREFIX_CACHE_MB="1")
    try:
        generate(engine, engine.tokenize(BASE))  # a stored prompt tells the cache what a token takes
        prompt = engine.tokenize(BASE + "too long for the cache now")
        cache = engine.batch.prefix_cache
        cache.capacity = cache.token_bytes * (len(prompt) - 1)
        before = engine.batch.prefills
        results, _ = together(engine, prompt, 2)
        assert engine.batch.prefills == before + 1
        assert [cached for _, _, cached in results] == [0, 0]
        assert all(tokens == generate(cold, prompt)[0] for tokens, _, _ in results)
    finally:
        engine.close()


def test_the_engine_reports_hits_misses_and_memory(warm):
    stats = warm.inference()["prefix_cache"]
    assert stats["hits"] > 0 and stats["misses"] > 0
    assert 0 < stats["used_bytes"] <= stats["capacity_bytes"] == 64 << 20
    assert warm.status()["prefix_cache"] == stats


def test_least_recently_used_prompts_leave_first():
    from millm_engine_transformers.prefix_cache import BLOCK, PrefixCache

    def layers(n):
        return [(torch.zeros(1, 1, n, 4), torch.zeros(1, 1, n, 4))]

    per = 2 * 4 * 4 * 2 * BLOCK  # two blocks of keys and values, float32
    cache = PrefixCache(capacity=3 * per)
    prompts = [[k] * (2 * BLOCK) for k in range(4)]
    for prompt in prompts[:3]:
        cache.store("k", prompt, layers(2 * BLOCK), {})
    assert cache.find("k", prompts[0] + [9], frozenset()) is not None  # now the most recent
    cache.store("k", prompts[3], layers(2 * BLOCK), {})
    assert cache.used <= cache.capacity and cache.evictions == 1
    assert cache.find("k", prompts[1] + [9], frozenset()) is None  # the least recently used left
    assert cache.find("k", prompts[0] + [9], frozenset()).length == 2 * BLOCK
    assert cache.find("other", prompts[0] + [9], frozenset()) is None


def test_the_cache_says_which_prompts_it_would_keep():
    from millm_engine_transformers.prefix_cache import BLOCK, PrefixCache

    cache = PrefixCache(capacity=1 << 20)
    assert cache.fits(BLOCK) and not cache.fits(BLOCK - 1)  # shorter than a block: nothing to find later
    cache.store("k", [1] * BLOCK, [(torch.zeros(1, 1, BLOCK, 4), torch.zeros(1, 1, BLOCK, 4))], {})
    assert cache.token_bytes == 2 * 4 * 4  # a key and a value of 4 floats
    assert cache.fits((1 << 20) // 32) and not cache.fits((1 << 20) // 32 + 1)
