"""Automatic prefix caching (issue 38): the same server with the cache on (``MILLM_PREFIX_CACHE_MB``) and off.

Two measures, each printed as on over off, both servers measured in this run, one
after the other (off, on, off: the two off runs bracket a machine whose speed drifts):

1. **Time to first token on turn 6** of a chat whose history is about
   ``--history`` tokens (default 2,000): five earlier turns of user and assistant
   messages (the assistant's given, so every run sends the same), then the sixth
   question, streamed. With the cache on, turn 6 reuses what turn 5's prompt
   computed. Each round is a new conversation (other words), so nothing of one
   round helps the next; the median over ``--rounds``.
2. **Throughput of 8 clients sharing a system prompt** of about ``--system`` tokens
   (default 500), each asking its own short question ``--requests`` times, one after
   the other, after a first answer each: completion tokens per second over all of them.

    python bench/prefix_cache.py [--tiny] [--rounds 5] [--history 2000] [--system 500] [--requests 4]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from millm_host.testing import ServerProcess  # noqa: E402
from millm_host.testing.tiny_models import tiny_llama  # noqa: E402

WORDS = (
    "river stone lantern orchard copper meadow harbor violet thunder pepper canyon maple "
    "silver garden falcon ember willow marble compass lagoon cedar saffron glacier"
).split()
CLIENTS = 8


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(rng: random.Random, history_tokens: int) -> list[list[dict]]:
    """Six turns' messages (each turn's prompt: every earlier message, then its question)."""
    per = history_tokens // 10  # five user and five assistant messages, about a word a token
    messages: list[dict] = [{"role": "system", "content": "You are a helpful assistant."}]
    turns = []
    for turn in range(6):
        messages.append({"role": "user", "content": f"Question {turn + 1}: {words(rng, per)}?"})
        turns.append(list(messages))
        messages.append({"role": "assistant", "content": words(rng, per)})
    return turns


def first_token_s(client: openai.OpenAI, model: str, messages: list[dict]) -> tuple[float, int]:
    """Seconds to the first streamed token, and the prompt tokens the server found cached."""
    began = time.perf_counter()
    first = None
    cached = 0
    stream = client.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - began
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    return (first if first is not None else time.perf_counter() - began), cached


def turn_six(server: ServerProcess, rounds: int, history: int, seed: int) -> tuple[float, int]:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=600)
    times, cached = [], 0
    for index in range(rounds):
        turns = conversation(random.Random(seed + index), history)
        for messages in turns[:5]:
            first_token_s(client, server.model_id, messages)
        took, cached = first_token_s(client, server.model_id, turns[5])
        times.append(took)
    return statistics.median(times), cached


def shared_system(server: ServerProcess, system_tokens: int, requests: int, seed: int) -> float:
    """Completion tokens per second of ``CLIENTS`` clients that share one system prompt, each sending
    ``requests`` requests one after the other, timed from when every client has had a first answer
    (cache on: the shared prompt is kept by then) to the last answer."""
    system = "You are a support assistant. Policy: " + words(random.Random(seed), system_tokens)
    counts = [0] * CLIENTS
    answered = threading.Barrier(CLIENTS + 1)

    def ask(client: openai.OpenAI, rng: random.Random) -> int:
        reply = client.chat.completions.create(
            model=server.model_id,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": words(rng, 12)}],
            max_tokens=32,
            temperature=0,
        )
        return reply.usage.completion_tokens

    def client_loop(index: int) -> None:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=600)
        rng = random.Random(seed * 100 + index)
        ask(client, rng)
        answered.wait()
        for _ in range(requests):
            counts[index] += ask(client, rng)

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    answered.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - began)


def measure(model_dir: Path | None, cache_mb: int, args: argparse.Namespace, seed: int) -> tuple[float, int, float]:
    env = {"MILLM_BATCHING": "continuous", "MILLM_PREFIX_CACHE_MB": str(cache_mb)}
    with tempfile.TemporaryDirectory() as data, ServerProcess(Path(data), model=model_dir, env=env) as server:
        first_token_s(
            openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none"),
            server.model_id,
            [{"role": "user", "content": "warm up"}],
        )
        ttft, cached = turn_six(server, args.rounds, args.history, seed)
        rate = shared_system(server, args.system, args.requests, seed)
        stats = httpx.get(f"{server.base_url}/api/health/inference", timeout=30).json().get("prefix_cache")
    seen = f"{stats['hits']} hits, {stats['misses']} misses, {stats['evictions']} evicted" if stats else "no cache"
    print(
        f"  cache {'on ' if cache_mb else 'off'}: turn 6 first token {ttft * 1000:7.0f} ms "
        f"(cached {cached} tokens), 8 clients {rate:6.1f} tokens/s ({seen})"
    )
    return ttft, cached, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a random 4-layer Llama instead of SmolLM2-135M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--history", type=int, default=2000, help="tokens before turn 6 (about)")
    parser.add_argument("--system", type=int, default=500, help="tokens of the shared system prompt (about)")
    parser.add_argument("--requests", type=int, default=4, help="each of the 8 clients, after its first")
    args = parser.parse_args()
    model_dir = None
    if args.tiny:
        model_dir = tiny_llama("prefix-bench", hidden_size=256, num_hidden_layers=4, intermediate_size=512)
    print(f"{os.cpu_count()} cores; history {args.history}, system prompt {args.system}, {args.rounds} rounds")
    off_a = measure(model_dir, 0, args, seed=1)
    on = measure(model_dir, 256, args, seed=1)
    off_b = measure(model_dir, 0, args, seed=1)
    off_ttft = (off_a[0] + off_b[0]) / 2
    off_rate = (off_a[2] + off_b[2]) / 2
    print(f"turn 6 time to first token, off over on: {off_ttft / on[0]:.2f}x faster (target >= 3)")
    print(f"8 clients sharing a system prompt, tokens/s on over off: {on[2] / off_rate:.2f}")


if __name__ == "__main__":
    main()
