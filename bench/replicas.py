"""Two replicas on one shared database: nothing lost or duplicated, and throughput against one replica.

Starts replicas A and B on one database: a fresh PostgreSQL database when
--database-url (a server URL) or MILLM_TEST_POSTGRES_URL is given, else a SQLite
file. A probe is armed once, on A; B arms it by converging (the bench waits for
B's /api/health/ready). Then, in one run:

  one replica:  --clients clients send to A only, for --seconds;
  two replicas: the same clients alternate A and B turn by turn, for --seconds.

Every client holds 3-turn conversations without X-miLLM-Session (each turn
resends the conversation, so the session is found by its keys, across replicas
in the second phase). Afterwards the database is read: each request (its trace
id) must have exactly one stored probe event and one session turn, each
conversation one session with its turns numbered 1..n. The figure is requests
per second with two replicas against one (on one machine both replicas share
its cores).

    python bench/replicas.py [--seconds 60] [--clients 8] [--model PATH|tiny] [--database-url URL]
"""

from __future__ import annotations

import argparse
import itertools
import secrets
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import sqlalchemy as sa

from millm_host.testing.replicas import FAST_CONVERGE, shared_database_url, wait_until
from millm_host.testing.server import ServerProcess

sys.path.insert(0, str(Path(__file__).parent))
from probe_overhead import import_probe  # noqa: E402  (a probe whose parity passes on this model)

TURNS = 3
QUESTIONS = ["Tell me about the sea.", "And the mountains?", "Which is older?"]


class Load:
    """The requests sent in one phase: per trace id, its replica and the session it was told it joined."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, tuple[str, str]] = {}  # trace id -> (replica, session id)
        self.conversations: list[list[str]] = []  # the trace ids of each conversation's turns
        self.errors: list[str] = []


def client(servers: list[ServerProcess], model: str, deadline: float, load: Load) -> None:
    https = [s.http(timeout=300) for s in servers]
    turn_of = itertools.count()
    try:
        while time.monotonic() < deadline:
            messages: list[dict[str, str]] = []
            traces: list[str] = []
            opening = f"Conversation {secrets.token_hex(4)}."  # identical conversations would be ambiguous
            for question in [f"{opening} {QUESTIONS[0]}", *QUESTIONS[1:TURNS]]:
                index = next(turn_of) % len(https)  # alternate replicas turn by turn
                trace = secrets.token_hex(16)
                messages.append({"role": "user", "content": question})
                try:
                    reply = https[index].post(
                        "/v1/chat/completions",
                        headers={"traceparent": f"00-{trace}-{secrets.token_hex(8)}-01"},
                        json={"model": model, "messages": messages, "max_tokens": 8, "temperature": 0},
                    )
                    reply.raise_for_status()
                except httpx.HTTPError as exc:
                    load.errors.append(f"{type(exc).__name__}: {exc}")
                    break
                messages.append({"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"]})
                traces.append(trace)
                with load.lock:
                    load.requests[trace] = (servers[index].base_url, reply.headers.get("x-millm-session-id", ""))
            with load.lock:
                load.conversations.append(traces)
    finally:
        for http in https:
            http.close()


def phase(servers: list[ServerProcess], model: str, clients: int, seconds: float) -> tuple[Load, float]:
    load = Load()
    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(servers, model, began + seconds, load)) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return load, time.monotonic() - began


def audit(url: str, load: Load) -> dict[str, int]:
    """Lost and duplicated events and session turns of ``load``'s requests, read from the database."""
    traces = list(load.requests)
    engine = sa.create_engine(url)
    events: Counter[str] = Counter()
    turns: Counter[str] = Counter()
    sessions: dict[str, tuple[int, list[int]]] = {}
    try:
        with engine.connect() as db:
            for chunk in range(0, len(traces), 500):
                part = {"t": traces[chunk : chunk + 500]}
                statement = sa.text("SELECT trace_id FROM probe_events WHERE trace_id IN :t").bindparams(
                    sa.bindparam("t", expanding=True)
                )
                events.update(row[0] for row in db.execute(statement, part))
                statement = sa.text("SELECT trace_id FROM probe_session_turns WHERE trace_id IN :t").bindparams(
                    sa.bindparam("t", expanding=True)
                )
                turns.update(row[0] for row in db.execute(statement, part))
            for session_id in {s for _, s in load.requests.values() if s}:
                count = db.scalar(sa.text("SELECT turns FROM probe_sessions WHERE id=:s"), {"s": session_id})
                numbers = [
                    r[0]
                    for r in db.execute(
                        sa.text("SELECT turn FROM probe_session_turns WHERE session_id=:s ORDER BY turn"),
                        {"s": session_id},
                    )
                ]
                sessions[session_id] = (count or 0, numbers)
    finally:
        engine.dispose()
    split = 0  # conversations whose turns were told different sessions
    for conversation in load.conversations:
        if len({load.requests[t][1] for t in conversation}) > 1:
            split += 1
    return {
        "requests": len(traces),
        "events_lost": sum(1 for t in traces if events[t] == 0),
        "events_duplicated": sum(1 for t in traces if events[t] > 1),
        "turns_lost": sum(1 for t in traces if turns[t] == 0),
        "turns_duplicated": sum(1 for t in traces if turns[t] > 1),
        "sessions": len(sessions),
        "sessions_miscounted": sum(1 for count, numbers in sessions.values() if numbers != list(range(1, count + 1))),
        "conversations_split": split,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--model", default=None, help="a model path, 'tiny' (a random 2-layer Llama) or the default")
    parser.add_argument("--database-url", default=None, help="a PostgreSQL server URL (a fresh database is made)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="millm-replicas-"))
    url = shared_database_url(root, args.database_url)
    model = args.model
    if model == "tiny":
        from millm_host.testing.tiny_models import tiny_llama

        model = str(tiny_llama())
    print(f"database: {sa.engine.make_url(url).render_as_string(hide_password=True)}")
    env = {"MILLM_DATABASE_URL": url, "MILLM_QUEUE_MAX": "64", **FAST_CONVERGE}
    a = ServerProcess(root / "a", model=model, env=env)
    b = ServerProcess(root / "b", model=model, env=env)
    try:
        a.start(900)
        b.start(900)
        with a.http(timeout=600) as http:
            model_id = http.get("/api/health").json()["model"]
            identity = http.get(f"/api/models/{model_id}").json()
            vector = [1] + np.random.default_rng(0).integers(100, 1000, 31).tolist()
            probe = import_probe(http, identity, "replicas-bench", identity["n_layers"] // 2, "mean", 0, vector)
            http.post(f"/api/probes/{probe}/arm", json={}).raise_for_status()
        wait_until(lambda: httpx.get(f"{b.base_url}/api/health/ready").status_code == 200, "B to arm the probe")
        print(f"probe {probe} armed on A; B converged. {args.clients} clients, {args.seconds:g} s per phase")
        phase([a], model_id, 2, min(5.0, args.seconds))  # warm-up, not counted
        one, one_s = phase([a], model_id, args.clients, args.seconds)
        two, two_s = phase([a, b], model_id, args.clients, args.seconds)
        results = {"one replica": (one, one_s), "two replicas": (two, two_s)}
        for name, (load, elapsed) in results.items():
            figures = audit(url, load)
            print(
                f"{name}: {figures['requests']} requests in {elapsed:.1f} s = {figures['requests'] / elapsed:.2f} req/s; "
                + ", ".join(f"{k} {v}" for k, v in figures.items() if k != "requests")
                + (f"; client errors {len(load.errors)}: {load.errors[:2]}" if load.errors else "")
            )
        ratio = (len(two.requests) / two_s) / (len(one.requests) / one_s) if one.requests else float("nan")
        print(f"throughput two replicas / one replica: {ratio:.3f}")
    finally:
        b.stop()
        a.stop()


if __name__ == "__main__":
    main()
