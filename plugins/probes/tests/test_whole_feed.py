"""The feed and status cover every process on the database: two replicas, and gunicorn's two workers.

A feed client connected to one process gets every result of every request served by any process
on the database, each once: its own at once, the others' from the tail of the events table
(``feed/tail.py``). A message relayed from another process says ``endpoint: null`` (only the process
that served a request knows its route), which is how the tests tell that both processes served.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import httpx
from websockets.sync.client import connect

from millm_host.testing.gunicorn import until_every_worker, workers
from millm_host.testing.helpers import post_retrying_busy
from millm_host.testing.replicas import FAST_CONVERGE, shared_database_url, wait_until

CHAT = [{"role": "user", "content": "Tell me about the lighthouse."}]


class FeedReader:
    """A feed client on its own thread, keeping every message it gets."""

    def __init__(self, base_url: str) -> None:
        self.messages: list[dict[str, Any]] = []
        self._url = base_url.replace("http://", "ws://") + "/api/probes/feed"
        self._open = threading.Event()
        self._socket: Any = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self._open.wait(10), "the feed did not open"

    def _read(self) -> None:
        with connect(self._url) as socket:
            self._socket = socket
            self._open.set()
            try:
                for text in socket:
                    self.messages.append(json.loads(text))
            except Exception:  # closed
                pass

    def close(self) -> None:
        self._socket.close()
        self._thread.join(timeout=5)

    def result_ids(self) -> Counter:
        return Counter(r["result_id"] for m in self.messages for r in m["results"])


def arm(http: httpx.Client, lab, helpers) -> str:
    identity = http.get(f"/api/models/{http.get('/api/health').json()['model']}").json()
    probe = helpers.import_probe(http, lab.definition(identity, name="whole-feed", threshold=-1e9, seed=5))
    helpers.arm(http, probe["id"])
    return probe["id"]


def chat(base: str, model: str) -> dict[str, Any]:
    reply = post_retrying_busy(base, "/v1/chat/completions", {"model": model, "messages": CHAT, "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    return reply.json()


def each_result_once(reader: FeedReader, bodies: list[dict[str, Any]]) -> None:
    """Every result of ``bodies`` reached ``reader`` exactly once (waiting for the tail), nothing else did."""
    sent = Counter(r["result_id"] for body in bodies for r in body["millm_probe_verdicts"])
    wait_until(lambda: set(reader.result_ids()) >= set(sent), "every result to reach the feed", timeout=30)
    time.sleep(1.0)  # a duplicate would come within a few tail passes
    assert reader.result_ids() == sent


def test_a_feed_on_one_replica_sees_both_replicas_traffic_once(
    replicas_factory, probe_model_dir, lab, helpers, tmp_path
):
    env = {"MILLM_DATABASE_URL": shared_database_url(tmp_path), "PROBE_TAIL_INTERVAL_MS": "100", **FAST_CONVERGE}
    a, b = replicas_factory(2, probe_model_dir, env=env)
    with a.http() as ha, b.http() as hb:
        probe_id = arm(ha, lab, helpers)
        wait_until(
            lambda: [p["probe_id"] for p in hb.get("/api/probes/status").json()["armed"]] == [probe_id], "B to arm"
        )
        reader = FeedReader(a.base_url)
        try:
            bodies = [chat(server.base_url, a.model_id) for server in (a, b, a, b, b)]
            each_result_once(reader, bodies)
        finally:
            reader.close()
        endpoints = Counter(m["endpoint"] for m in reader.messages)
        assert endpoints == {"chat.completions": 2, None: 3}  # A's own, and B's relayed
        # Status on either replica counts every request, whoever served it.
        for http in (ha, hb):
            wait_until(
                lambda http=http: http.get("/api/probes/status").json()["armed"][0]["recent_requests"] == 5,
                "status to count all five requests",
            )


def test_a_feed_on_one_gunicorn_worker_sees_every_workers_traffic_once(probe_model_dir, lab, helpers, tmp_path):
    with workers(probe_model_dir, tmp_path, count=2, env={"PROBE_TAIL_INTERVAL_MS": "100", **FAST_CONVERGE}) as base:
        with httpx.Client(base_url=base, timeout=60) as http:
            probe_id = arm(http, lab, helpers)
            model = http.get("/api/health").json()["model"]

        armed_at = time.time()

        def armed_here(reply: httpx.Response) -> str | None:
            # A convergence pass that ended well after the arm has armed it (a pass reads the stored state
            # first: one that read it before the arm would have to run on for a second past it)
            replica = reply.json()["replica"]
            converged = replica["convergers"].get("probes", {}).get("converged")
            return replica["id"] if converged and (replica["checked_at"] or 0) > armed_at + 1.0 else None

        until_every_worker(base, 2, armed_here, "/api/health", timeout=60)
        assert [p["probe_id"] for p in httpx.get(f"{base}/api/probes/status").json()["armed"]] == [probe_id]
        reader = FeedReader(base)
        try:
            bodies: list = [None] * 12  # at once, on new connections: the kernel spreads them over the workers
            threads = [threading.Thread(target=lambda i=i: bodies.__setitem__(i, chat(base, model))) for i in range(12)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            each_result_once(reader, bodies)
        finally:
            reader.close()
        endpoints = Counter(m["endpoint"] for m in reader.messages)
        assert endpoints["chat.completions"] >= 1 and endpoints[None] >= 1, endpoints  # both workers served
