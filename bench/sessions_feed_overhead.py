"""Sessions and the live feed per token: prefix matching, turns and K feed clients against sessions off.

Two ``millm serve`` on the default model, each with the same probe armed:

- **on:** the defaults (``PROBE_SESSIONS`` on): every chat settles its session by
  conversation prefix (a worker thread, before generation), writes its turn and
  publishes its results to the feed (the engine thread, after generation), with
  ``--feed-clients`` WebSocket clients on ``/api/probes/feed``: all but one read
  every message, one connects and never reads (a stalled consumer).
- **off:** ``PROBE_SESSIONS=false`` and no feed client: the same probe scoring and
  verdict storage, no session lookup, no turn, nothing published.

Requests are streamed chats (temperature 0), timed from the client: the median
interval between streamed tokens (the per-token figure; the first gap holds the
prompt pass and is left out) and the whole request (which also holds the
session lookup, the turn and the feed). The servers take turns, the order
alternating each round, and the figures are medians of per-round paired ratios.

Cases:
- **short:** a two-turn chat (its first turn already a stored turn, so every
  request is a prefix hit and a new turn), ``--gen-tokens`` tokens.
- **long:** a conversation of ``--turns`` turns, built first on both servers turn
  by turn (each request resends the whole conversation, ``--turn-tokens`` tokens
  per reply; every build request is timed too, paired by turn), then timed each
  round as the next turn with ``--gen-tokens`` tokens.

    OMP_NUM_THREADS=1 python bench/sessions_feed_overhead.py [--rounds 7] [--turns 50] [--feed-clients 4]

Target (issue 16): nothing measurable per token (ratios within noise of 1.0).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from websockets.sync.client import connect

from millm_host.testing.server import ServerProcess

_spec = importlib.util.spec_from_file_location("probe_overhead", Path(__file__).with_name("probe_overhead.py"))
assert _spec is not None and _spec.loader is not None
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)

STORY = "Write a long story about a lighthouse keeper who finds a message in a bottle."


class Reader(threading.Thread):
    """A feed client that reads every message (counts them, and what the server says it missed)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.socket = connect(url, max_size=None).__enter__()  # closed by run's end
        self.messages = 0
        self.missed = 0

    def run(self) -> None:
        try:
            for raw in self.socket:
                message = json.loads(raw)
                self.messages += 1
                self.missed = message.get("missed_total", 0)
        except Exception:  # closed at the end of the run
            pass


def arm_probe(server: ServerProcess) -> str:
    with server.http(timeout=600) as http:
        model_id = http.get("/api/health").json()["model"]
        identity = http.get(f"/api/models/{model_id}").json()
        ids = [1] + np.random.default_rng(0).integers(100, 40000, 47).tolist()
        probe_id = overhead.import_probe(http, identity, "bench-session", 10, "mean", 1, ids)
        http.post(f"/api/probes/{probe_id}/arm", json={}).raise_for_status()
    return model_id


def chat(http, model_id: str, messages: list[dict], max_tokens: int) -> tuple[float, float | None, str, dict]:
    """(whole request s, median token interval s or None, reply text, response headers) of one streamed chat."""
    body = {"model": model_id, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    arrivals, parts = [], []
    began = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        headers = dict(response.headers)
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or []
            text = (choices[0].get("delta") or {}).get("content") if choices else None
            if text:
                arrivals.append(time.perf_counter())
                parts.append(text)
    elapsed = time.perf_counter() - began
    gaps = [b - a for a, b in zip(arrivals[1:], arrivals[2:], strict=False)]
    return elapsed, (statistics.median(gaps) if gaps else None), "".join(parts), headers


def run(args: argparse.Namespace) -> None:
    off = ServerProcess(Path(tempfile.mkdtemp(prefix="millm-bench-off-")), env={"PROBE_SESSIONS": "false"})
    on = ServerProcess(Path(tempfile.mkdtemp(prefix="millm-bench-on-")), env={"PROBE_FEED_QUEUE": str(args.feed_queue)})
    readers: list[Reader] = []
    stack = contextlib.ExitStack()
    try:
        for server in (off, on):
            server.start(600)
        model_id = arm_probe(off)
        arm_probe(on)
        feed = on.base_url.replace("http://", "ws://") + "/api/probes/feed"
        readers = [Reader(feed) for _ in range(args.feed_clients - 1)]
        for reader in readers:
            reader.start()
        # never read until the end (and no keepalive of its own: only the server may give up on it)
        stalled = None
        if args.feed_clients:  # a small receive buffer: the server's sends back up after a few messages
            raw = socket.socket()
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            raw.connect(("127.0.0.1", on.port))
            stalled = stack.enter_context(connect(feed, sock=raw, max_queue=1, ping_interval=None))
        servers = {"off": off, "on": on}
        clients = {name: server.http(timeout=600) for name, server in servers.items()}

        # the short chat's first turn: stored on "on", so each timed request continues it
        opening = [{"role": "user", "content": STORY}]
        short = {}
        for name, http in clients.items():
            _, _, reply, _ = chat(http, model_id, opening, args.turn_tokens)
            short[name] = [*opening, {"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
        for name, http in clients.items():  # warm both paths once
            chat(http, model_id, short[name], args.gen_tokens)

        # the long conversation, built turn by turn on both (paired per turn)
        conversation = {name: [] for name in servers}
        build = {name: [] for name in servers}
        session_ids = set()
        for turn in range(args.turns):
            order = ("off", "on") if turn % 2 == 0 else ("on", "off")
            for name in order:
                conversation[name].append({"role": "user", "content": f"Turn {turn + 1}: tell me one more thing."})
                elapsed, _, reply, headers = chat(clients[name], model_id, conversation[name], args.turn_tokens)
                conversation[name].append({"role": "assistant", "content": reply})
                build[name].append(elapsed)
                if name == "on":
                    session_ids.add(headers.get("x-millm-session-id"))
        for name in servers:
            conversation[name].append({"role": "user", "content": "Now tell me the whole story again."})

        figures: dict[str, dict[str, list[float]]] = {
            case: {"total_off": [], "total_on": [], "gap_off": [], "gap_on": []} for case in ("short", "long")
        }
        for round_ in range(args.rounds):
            order = ("off", "on") if round_ % 2 == 0 else ("on", "off")
            for case, messages in (("short", short), ("long", conversation)):
                for name in order:
                    elapsed, gap, _, headers = chat(clients[name], model_id, messages[name], args.gen_tokens)
                    if name == "on":
                        assert headers.get("x-millm-session-id"), "the on server joined no session"
                    else:
                        assert "x-millm-session-id" not in headers, "the off server still groups sessions"
                    figures[case][f"total_{name}"].append(elapsed)
                    figures[case][f"gap_{name}"].append(gap if gap is not None else float("nan"))
        stalled_missed: object = None
        if stalled is not None:
            try:
                stalled_missed = json.loads(stalled.recv(timeout=30)).get("missed_total")
            except Exception as exc:  # e.g. the server closed it: it answered no keepalive ping
                stalled_missed = f"nothing: {type(exc).__name__}: {exc}"
        for http in clients.values():
            http.close()
    finally:
        for reader in readers:
            reader.socket.close()
        stack.close()
        for server in (off, on):
            server.stop()

    median = statistics.median
    print(
        f"model {model_id}; one probe armed on both servers; on: sessions by prefix + {args.feed_clients} feed "
        f"clients (1 stalled, per-client queue {args.feed_queue}); off: PROBE_SESSIONS=false, no feed client; "
        f"{args.rounds} interleaved rounds"
    )
    for case, f in figures.items():
        gap_ratio = median(a / b for a, b in zip(f["gap_on"], f["gap_off"], strict=True))
        total_ratio = median(a / b for a, b in zip(f["total_on"], f["total_off"], strict=True))
        paired_ms = median(a - b for a, b in zip(f["total_on"], f["total_off"], strict=True)) * 1000
        length = f"{args.turns}-turn conversation" if case == "long" else "two-turn chat"
        print(
            f"{case} ({length}, {args.gen_tokens} tokens): per token {median(f['gap_off']) * 1000:.2f} ms off, "
            f"{median(f['gap_on']) * 1000:.2f} ms on, median paired ratio {gap_ratio:.4f}; whole request "
            f"{median(f['total_off']) * 1000:.1f} ms off, {median(f['total_on']) * 1000:.1f} ms on, paired "
            f"{paired_ms:+.1f} ms, ratio {total_ratio:.4f}"
        )
    turn_ratios = [a / b for a, b in zip(build["on"], build["off"], strict=True)]
    tenth = max(1, args.turns // 5)
    print(
        f"building the {args.turns}-turn conversation ({args.turn_tokens} tokens a reply, whole conversation resent): "
        f"median paired ratio on/off {median(turn_ratios):.4f}; first {tenth} turns {median(turn_ratios[:tenth]):.4f}, "
        f"last {tenth} turns {median(turn_ratios[-tenth:]):.4f}; total {sum(build['off']):.1f} s off, "
        f"{sum(build['on']):.1f} s on; sessions it joined on 'on': {len(session_ids)}"
    )
    if readers:
        print(
            f"feed: readers got {[r.messages for r in readers]} messages (missed {[r.missed for r in readers]}); "
            f"the stalled client's first message says it missed {stalled_missed}"
        )
    ratio = median(
        a / b
        for a, b in zip(
            figures["short"]["gap_on"] + figures["long"]["gap_on"],
            figures["short"]["gap_off"] + figures["long"]["gap_off"],
            strict=True,
        )
    )
    print(f"ratio per token on / off (both cases, median paired): {ratio:.4f}  (target: 1.0 within noise)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--turns", type=int, default=50, help="turns of the long conversation")
    parser.add_argument("--gen-tokens", type=int, default=48, help="tokens of each timed request")
    parser.add_argument("--turn-tokens", type=int, default=8, help="tokens of each reply while building")
    parser.add_argument("--feed-clients", type=int, default=4, help="WebSocket clients on 'on' (one stalled)")
    parser.add_argument("--feed-queue", type=int, default=16, help="PROBE_FEED_QUEUE on 'on' (the stalled drops)")
    args = parser.parse_args()
    if args.rounds < 1 or args.turns < 1 or args.gen_tokens < 4:
        parser.error("use at least one round, one turn and 4 tokens")
    run(args)


if __name__ == "__main__":
    main()
