"""Prefix caching through the app's HTTP API (in-process): what a client sees and what an operator counts.

A second turn of a chat reuses the first's prompt (``usage.prompt_tokens_details.cached_tokens``
through the ``openai`` SDK; the Messages API's ``cache_read_input_tokens``) and answers what a
server without the cache answers; ``/metrics`` counts hits and misses and
``/api/health/inference`` reports the cache.
"""

from __future__ import annotations

import re

import httpx
import pytest

SYSTEM = "You are a patient assistant who explains things about lighthouses in plain words. " * 4


@pytest.fixture(scope="module")
def warm_server(tiny_app):
    return tiny_app(MILLM_BATCHING="continuous", MILLM_PREFIX_CACHE_MB="32")


@pytest.fixture(scope="module")
def cold_server(tiny_app):
    return tiny_app(MILLM_BATCHING="continuous", MILLM_PREFIX_CACHE_MB="0")


def turns() -> list[list[dict]]:
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Why do lighthouses have lenses?"}]
    second = [*first, {"role": "assistant", "content": "To gather the light."}, {"role": "user", "content": "How?"}]
    return [first, second]


def chat(server, messages, **extra):
    return server.openai().chat.completions.create(
        model=server.model_id, messages=messages, max_tokens=6, temperature=0, **extra
    )


def counted(server, result: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    found = re.search(rf'millm_prefix_cache_lookups_total\{{model="[^"]*",result="{result}"\}} ([0-9.e+]+)', text)
    return float(found.group(1)) if found else 0.0


def test_a_second_turn_reuses_the_first_and_answers_as_a_server_without_the_cache(warm_server, cold_server):
    first, second = turns()
    hits, misses = counted(warm_server, "hit"), counted(warm_server, "miss")
    one = chat(warm_server, first)
    two = chat(warm_server, second)
    assert one.usage.prompt_tokens_details.cached_tokens == 0
    reused = two.usage.prompt_tokens_details.cached_tokens
    assert one.usage.prompt_tokens - 8 < reused < two.usage.prompt_tokens  # the first turn's prompt, bar its tail
    assert two.choices[0].message.content == chat(cold_server, second).choices[0].message.content
    assert chat(cold_server, second).usage.prompt_tokens_details.cached_tokens == 0
    assert counted(warm_server, "hit") == hits + 1 and counted(warm_server, "miss") == misses + 1
    report = httpx.get(f"{warm_server.base_url}/api/health/inference", timeout=30).json()["prefix_cache"]
    assert report["entries"] >= 1 and 0 < report["used_bytes"] <= report["capacity_bytes"] == 32 << 20
    assert httpx.get(f"{cold_server.base_url}/api/health/inference", timeout=30).json()["prefix_cache"] is None


def test_a_streamed_answer_reports_what_it_reused(warm_server):
    first, _ = turns()
    chat(warm_server, first)
    chunks = list(chat(warm_server, first, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1  # all but the last token


def test_the_messages_api_reports_cache_reads(warm_server):
    body = {
        "model": warm_server.model_id,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "Tell me about fog horns."}],
        "max_tokens": 4,
    }
    with warm_server.http() as http:
        http.post("/v1/messages", json=body).raise_for_status()
        again = http.post("/v1/messages", json=body).json()
    # Anthropic counts cache reads apart: input_tokens is what was computed (the last prompt token)
    assert again["usage"]["input_tokens"] == 1 and again["usage"]["cache_read_input_tokens"] > 80
