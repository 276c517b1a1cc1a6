"""Event-loop stalls while one large, legal body is read, parsed and validated (issue 11 §0).

A real ``millm serve`` on a tiny random model; a thread asks ``/api/health`` again
and again while one body of about 4 MiB is sent (``tests/test_hostile_input.health_while``).
The figure is the slowest health answer. The baseline, measured in the same run, is
the slowest health answer while a small chat is sent the same way: what the machine
and the HTTP stack cost with no large body. Each shape runs ``--runs`` times; the
median of the slowest answers is printed, and its ratio to the baseline. Beside them: the
machine's load (``os.getloadavg``, 1-minute) at the start and end, and its median over each
shape's runs, taken as each run ends: on a shared machine the figures follow the load.

``--nfc`` serves a tiny model whose tokenizer NFC-normalizes every text first, as Qwen's and
GPT-NeoX's do (its token bound counts only the characters NFC keeps).
``--engine gguf`` serves a tiny GGUF model with a UGM vocabulary instead (``tiny_ugm_gguf``): a
UGM text has no cheap token bound, so a 4 MiB prompt or embedding input is tokenized whole
(4 million ids) before it is refused, and its small baseline is a one-token completion.

    python bench/event_loop_stall.py [--runs 5] [--shapes many-messages,long-messages,...] [--nfc | --engine gguf]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from millm_host.testing import BODY_LIMIT, ServerProcess, health_while, just_under_the_limit  # noqa: E402
from millm_host.testing.tiny_models import tiny_llama, tiny_ugm_gguf  # noqa: E402


def shapes(model: str) -> dict[str, tuple[str, bytes]]:
    m = json.dumps(model).encode()
    chat = b'{"model":' + m + b',"max_tokens":1,"messages":['
    nested = b"[" * 60 + b"1" + b"]" * 60
    return {
        "small": ("/v1/chat/completions", chat + b'{"role":"user","content":"hi"}]}'),
        "many-messages": (  # 150k tiny messages: past MILLM_MAX_MESSAGES, still parsed
            "/v1/chat/completions",
            just_under_the_limit(chat, b'{"role":"user","content":"a"},', b'{"role":"user","content":"a"}]}'),
        ),
        "long-messages": (  # 4,096 messages of ~900 bytes: a legal chat
            "/v1/chat/completions",
            json.dumps(
                {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "a " * 450}] * 4096}
            ).encode(),
        ),
        "composing": (  # one 4 MiB string of characters NFC composes, decomposed, and CJK
            "/v1/completions",
            json.dumps(
                {"model": model, "max_tokens": 1, "prompt": "e\u0301 日本 " * ((BODY_LIMIT - 200) // 11)},
                ensure_ascii=False,
            ).encode(),
        ),
        "one-string": (  # one 4 MiB string
            "/v1/chat/completions",
            chat + b'{"role":"user","content":"' + b"a " * ((BODY_LIMIT - 200 - len(chat)) // 2) + b'"}]}',
        ),
        "token-ids": (  # 2M token ids as embeddings input
            "/v1/embeddings",
            just_under_the_limit(b'{"model":' + m + b',"input":[', b"1,", b"1]}"),
        ),
        "detokenize": (  # 500,000 ids back to text (issue 35 §5: one tokenizers call held the GIL 100-200 ms)
            "/detokenize",
            json.dumps({"model": model, "tokens": [(i * 7919) % 40_000 for i in range(500_000)]}).encode(),
        ),
        "tools": (  # a chat of 1,000 tools (the first one built llguidance's tokenizer view: 200-400 ms of GIL)
            "/v1/chat/completions",
            json.dumps(
                {
                    "model": model,
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": "hi"}],
                    "tools": [
                        {"type": "function", "function": {"name": f"tool_{i}", "parameters": {"type": "object"}}}
                        for i in range(1000)
                    ],
                }
            ).encode(),
        ),
        "nested": (  # 60 levels deep, repeated in an ignored field: 2M arrays, past MILLM_MAX_JSON_CONTAINERS
            "/v1/chat/completions",
            just_under_the_limit(chat + b'{"role":"user","content":"hi"}],"x":[', nested + b",", nested + b"]}"),
        ),
    }


def ugm_shapes(model: str) -> dict[str, tuple[str, bytes]]:
    text = "ab" * ((BODY_LIMIT - 200) // 2)  # one id per character: "ab" is no piece of the tiny vocabulary
    return {
        "small": ("/v1/completions", json.dumps({"model": model, "prompt": "hello", "max_tokens": 1}).encode()),
        "ugm-prompt": ("/v1/completions", json.dumps({"model": model, "prompt": text, "max_tokens": 1}).encode()),
        "ugm-embedding": ("/v1/embeddings", json.dumps({"model": model, "input": text}).encode()),
    }


def start_server(engine: str, nfc: bool) -> ServerProcess:
    folder = Path(tempfile.mkdtemp())
    if engine == "gguf":
        model = tiny_ugm_gguf(folder / "models")
        env = {"GGUF_N_THREADS": "1", "GGUF_N_THREADS_BATCH": "1"}
        return ServerProcess(folder, model=str(model), args=["--engine", "gguf"], env=env).start()
    return ServerProcess(folder, model=str(tiny_llama(nfc=nfc))).start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--shapes", default="")
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--engine", choices=("transformers", "gguf"), default="transformers")
    model.add_argument("--nfc", action="store_true", help="the tiny model's tokenizer NFC-normalizes first")
    args = parser.parse_args()
    server = start_server(args.engine, args.nfc)
    try:
        bodies = (ugm_shapes if args.engine == "gguf" else shapes)(server.model_id)
        # This process imported torch and transformers (to write the tiny model): a full collection here
        # took 100-170 ms and delayed the health poller as if the server had stalled. Frozen, it has none.
        gc.collect()
        gc.freeze()
        wanted = ["small", *[s for s in (args.shapes.split(",") if args.shapes else bodies) if s != "small"]]
        slowest: dict[str, list[float]] = {name: [] for name in wanted}
        loads: dict[str, list[float]] = {name: [] for name in wanted}
        codes: dict[str, str] = {}
        load_at_start = os.getloadavg()
        for _ in range(args.runs):
            for name in wanted:  # interleaved, so background load hits every shape alike
                path, body = bodies[name]
                response, worst = health_while(server, "POST", path, body)
                slowest[name].append(worst)
                loads[name].append(os.getloadavg()[0])
                codes[name] = f"{response.status_code} " + (
                    response.json().get("error", {}).get("code", "") if response.status_code >= 400 else ""
                )
        load_at_end = os.getloadavg()
        base = statistics.median(slowest["small"])
        print(f"load average (1, 5, 15 min): {_loads(load_at_start)} at the start, {_loads(load_at_end)} at the end")
        print(
            f"{'shape':15} {'body':>9} {'answer':28} {'slowest /api/health (median, min-max)':>40} {'ratio':>7} "
            f"{'load':>5}"
        )
        for name in wanted:
            times = slowest[name]
            med = statistics.median(times)
            size = f"{len(bodies[name][1]) / 2**20:.2f} MiB"
            span = f"{med * 1000:.1f} ms ({min(times) * 1000:.1f}-{max(times) * 1000:.1f})"
            load = statistics.median(loads[name])
            print(f"{name:15} {size:>9} {codes[name]:28} {span:>40} {med / base:7.2f} {load:5.2f}")
    finally:
        server.stop()


def _loads(averages: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.2f}" for x in averages)


if __name__ == "__main__":
    main()
