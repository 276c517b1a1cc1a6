"""The live feed ``probe:results``: a real WebSocket client against a real server, and the queue's bound."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

ADMIN = {"Authorization": "Bearer admin-key"}
PROMPT = "Describe the lighthouse keeper's secret plan in detail."


@pytest.fixture(scope="module")
def server(probe_app):
    return probe_app(MILLM_ADMIN_API_KEYS="admin-key", MILLM_API_KEYS="user-key", PROBE_FEED_QUEUE="4")


@pytest.fixture(scope="module")
def armed(server, lab, helpers):
    """A behaviour's probe that always fires, and a probe of no behaviour that never does."""
    with server.http(headers=ADMIN) as http:
        model_id = http.get("/api/health").json()["model"]
        identity = http.get(f"/api/models/{model_id}").json()
        ids = []
        for doc in (
            lab.definition(identity, name="feed-fires", behaviour="feed-stakes", threshold=-1e9, seed=11),
            lab.definition(identity, name="feed-quiet", threshold=1e9, seed=12),
        ):
            probe = helpers.import_probe(http, doc)
            helpers.arm(http, probe["id"])
            ids.append(probe["id"])
    return model_id, ids


def feed_url(server, query: str = "") -> str:
    return server.base_url.replace("http://", "ws://") + "/api/probes/feed" + (f"?{query}" if query else "")


def test_the_feed_is_authenticated_like_the_api(server, armed):
    for headers in ({}, {"Authorization": "Bearer user-key"}):  # no key; a /v1 key
        with pytest.raises(InvalidStatus), connect(feed_url(server), additional_headers=headers):
            pass
    with (
        pytest.raises(InvalidStatus),
        connect(feed_url(server), additional_headers=ADMIN, origin="https://evil.example"),
    ):
        pass  # a page elsewhere cannot open it (a browser sends no CORS preflight for a socket)
    with connect(feed_url(server), additional_headers=ADMIN):
        pass


def test_one_message_per_request_for_chat_streamed_chat_and_completions_and_never_text(server, armed):
    model_id, (fires, quiet) = armed
    user = {"Authorization": "Bearer user-key"}
    with (
        connect(feed_url(server), additional_headers=ADMIN) as everything,
        connect(feed_url(server, "fired=true&behaviour=feed-stakes"), additional_headers=ADMIN) as fired_only,
        server.http(headers=user) as http,
    ):
        chat = {"model": model_id, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4}
        answered = http.post("/v1/chat/completions", json=chat, headers={"X-miLLM-Session": "feed-1"})
        assert answered.status_code == 200
        with http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as stream:
            streamed = stream.read().decode()
        completion = http.post("/v1/completions", json={"model": model_id, "prompt": PROMPT, "max_tokens": 4})
        assert completion.status_code == 200
        texts = [
            PROMPT,
            answered.json()["choices"][0]["message"]["content"],
            completion.json()["choices"][0]["text"],
        ]
        raw = [everything.recv(timeout=60) for _ in range(3)]
        filtered = [json.loads(fired_only.recv(timeout=60)) for _ in range(3)]
    messages = [json.loads(m) for m in raw]
    assert [m["endpoint"] for m in messages] == ["chat.completions", "chat.completions", "completions"]
    assert all(m["type"] == "probe:results" and m["missed"] == 0 for m in messages)
    assert messages[0]["session_id"] == "feed-1" and messages[0]["turn"] == 1
    assert messages[0]["results"] == answered.json()["millm_probe_verdicts"]  # the same objects, in order
    assert [r["probe_id"] for r in messages[0]["results"]] == [quiet, fires]  # behaviour by behaviour, by key
    assert all(r["schema"] == "mi.probe.result/v1" for m in messages for r in m["results"])
    assert "[DONE]" in streamed
    for message in raw:  # no prompt, reply or context text
        assert "detail" not in message and "context_text" not in message
        for text in texts:
            assert text.strip() and text.strip() not in message
    assert [[r["probe_id"] for r in m["results"]] for m in filtered] == [[fires]] * 3


def test_a_stalled_client_does_not_delay_a_chat(server, armed):
    model_id, _ = armed
    with (
        connect(feed_url(server), additional_headers=ADMIN, max_queue=1) as stalled,
        server.http(headers=ADMIN) as http,
    ):
        for _ in range(12):  # three times the server's per-client queue; the socket is never read meanwhile
            response = http.post(
                "/v1/chat/completions",
                json={"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
            )
            assert response.status_code == 200
        first = json.loads(stalled.recv(timeout=60))
    assert first["type"] == "probe:results"


def test_a_full_queue_drops_the_oldest_and_says_how_many():
    from millm_probes.feed.websocket import Feed, Filters

    async def scenario():
        feed = Feed(capacity=2)
        client = feed.subscribe(Filters())
        for i in range(5):
            feed.publish(
                [{"probe_id": "p", "fires": True, "n": i}], request_id=str(i), endpoint="x", session=None, turn=None
            )
        first, second = await client.next(), await client.next()
        feed.unsubscribe(client)
        return first, second, feed.clients

    first, second, clients = asyncio.run(scenario())
    assert (first["request_id"], first["missed"], first["missed_total"]) == ("3", 3, 3)
    assert (second["request_id"], second["missed"], second["missed_total"]) == ("4", 0, 3)
    assert clients == set()


def test_filters_pick_behaviour_probe_and_fired():
    from millm_probes.feed.websocket import Filters

    fired = {"behaviour": "b", "probe_id": "p1", "fires": True}
    quiet = {"behaviour": None, "probe_id": "p2", "fires": False}
    assert Filters(behaviours=frozenset({"b"})).wants(fired) and not Filters(behaviours=frozenset({"b"})).wants(quiet)
    assert Filters(probes=frozenset({"p2"})).wants(quiet) and not Filters(probes=frozenset({"p2"})).wants(fired)
    assert Filters(fired_only=True).wants(fired) and not Filters(fired_only=True).wants(quiet)
