"""Live results on every surface: header, body, stream chunk, stored events, status; and the reasons."""

from __future__ import annotations

import json
import re
import time

import pytest

from millm_host.api import parse_list
from millm_host.testing import chat as post_chat

WINDOWS = ["all", "prompt", "response"]
CHAT = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.fixture(scope="module")
def armed_pair(probes_server, lab, identity, helpers):
    """Two armed probes for this module: one of a behaviour with a bar, one ranking only."""
    docs = [
        lab.definition(identity, name="stakes-a", behaviour="high-stakes", rule="max", windows=WINDOWS),
        lab.definition(identity, name="ranker", layer=2, rule="mean", threshold=None, rung=3, seed=3),
    ]
    with probes_server.http() as http, helpers.armed(http, docs) as ids:
        yield ids


def chat(http, model_id, headers=None, **extra):
    """A short greedy chat that succeeds."""
    response = post_chat(
        http, model_id, headers=headers, **{"messages": CHAT, "max_tokens": 5, "temperature": 0, **extra}
    )
    assert response.status_code == 200, response.text
    return response


def test_header_and_body_carry_the_same_results(probes_server, armed_pair, model_id):
    client = probes_server.openai()
    raw = client.chat.completions.with_raw_response.create(model=model_id, messages=CHAT, max_tokens=5, temperature=0)
    completion = raw.parse()
    results = completion.model_extra["millm_probe_verdicts"]
    assert [(r["probe_id"], r["window"]) for r in results] == [(armed_pair[0], w) for w in WINDOWS] + [
        (armed_pair[1], "all")
    ]  # behaviour by behaviour, then name
    members = list(parse_list(raw.headers["x-millm-probe-verdicts"]))
    assert len(members) == len(results)
    for member, result in zip(members, results, strict=True):
        assert member.value == result["name"]
        params = dict(member.params)
        assert float(params["score"]) == pytest.approx(round(result["score"], 3), abs=1e-9)
        assert params["rung"] == result["rung"]
        assert str(params["window"]) == result["window"]
        assert params["probe"] == result["probe_id"]
        assert params.get("behaviour") == result["behaviour"]
        if "verdict" in result:
            assert params["verdict"] is result["verdict"] and float(params["threshold"]) == result["threshold"]
        else:  # no threshold: no verdict, which is not a "no"
            assert "verdict" not in params and result["fires"] is None and result["threshold"] is None
        assert "result_id" not in params
    # Served by the continuous batch (the default: probes score inside it), alone in it.
    assert {(r["persistence"], r["execution_mode"], r["batch_size"]) for r in results} == {
        ("persisted", "continuous", 1)
    }
    assert {r["request_id"] for r in results} == {completion.id.removeprefix("chatcmpl-")}


def test_streaming_sends_the_verdicts_on_the_finish_chunk(probes_server, armed_pair, model_id):
    client = probes_server.openai()
    stream = client.chat.completions.create(
        model=model_id, messages=CHAT, max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    extras = [i for i, c in enumerate(chunks) if (c.model_extra or {}).get("millm_probe_verdicts")]
    assert len(extras) == 1
    chunk = chunks[extras[0]]
    assert chunk.choices[0].finish_reason is not None and chunk.object == "chat.completion.chunk"
    assert extras[0] == len(chunks) - 2  # then only the usage chunk, last, as OpenAI sends it
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.choices and c.usage is None for c in chunks[:-1])
    results = chunk.model_extra["millm_probe_verdicts"]
    assert len(results) == 4 and all(r["status"] == "final" for r in results)
    with probes_server.http() as http:
        with http.stream(
            "POST", "/v1/chat/completions", json={"model": model_id, "messages": CHAT, "max_tokens": 3, "stream": True}
        ) as response:
            assert "x-millm-probe-verdicts" not in response.headers  # no header before the body
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    final = json.loads(lines[-2][len("data: ") :])
    assert "millm_probe_verdicts" in final and final["choices"][0]["finish_reason"] is not None


def test_a_disconnected_stream_stores_interrupted_results(probes_server, armed_pair, model_id):
    trace = "0af7651916cd43dd8448eb211c80319c"
    with probes_server.http() as http:
        with http.stream(
            "POST",
            "/v1/chat/completions",
            headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"},
            json={"model": model_id, "messages": CHAT, "max_tokens": 3500, "stream": True},
        ) as response:
            seen = 0
            for line in response.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    seen += 1
                    if seen == 5:
                        break  # the client goes away mid-stream
        deadline = time.monotonic() + 30
        events = []
        while time.monotonic() < deadline and len(events) < 4:
            events = http.get("/api/probes/events", params={"trace_id": trace}).json()["data"]
            time.sleep(0.2)
    assert len(events) == 4
    for event in events:
        assert (event["outcome"], event["reason"]) == ("interrupted", "client_disconnected")
        assert event["status"] in ("partial", "unavailable") and "verdict" not in event
        if event["window"] in ("all", "prompt"):  # the prompt was seen: a score over what was seen
            assert event["status"] == "partial" and isinstance(event["score"], float)
            assert event["n_scored_tokens"] > 0 and event["fires"] is None


def test_batched_requests_are_recorded_as_skipped(probes_server, armed_pair, model_id):
    with probes_server.http() as http:
        for extra in ({"n": 2}, {"extra_messages": [[{"role": "user", "content": "another"}]]}):
            response = chat(http, model_id, **extra)
            members = list(parse_list(response.headers["x-millm-probe-verdicts"]))
            assert all(m.params["scored"] is False and str(m.params["reason"]) == "batched_request" for m in members)
            results = response.json()["millm_probe_verdicts"]
            assert {(r["outcome"], r["reason"], r["execution_mode"], r["batch_size"]) for r in results} == {
                ("skipped", "batched_request", "batched", None)
            }
            stored = http.get("/api/probes/events", params={"result_id": results[0]["result_id"]}).json()["data"]
            assert stored == [results[0]]
        status = http.get("/api/probes/status").json()
        quiet = {p["probe_id"]: p for p in status["armed"]}
        assert quiet[armed_pair[0]]["quiet"] is True and quiet[armed_pair[0]]["quiet_reason"] == "batched_request"


def test_judge_traffic_is_never_scored(probes_server, armed_pair, model_id):
    with probes_server.http() as http:
        response = chat(http, model_id, headers={"X-miLLM-Origin": "judge"})
    assert {r["reason"] for r in response.json()["millm_probe_verdicts"]} == {"judge_traffic"}


def test_scoring_and_embeddings_are_never_monitored(probes_server, armed_pair, model_id):
    with probes_server.http() as http:
        before = http.get("/api/probes/events", params={"limit": 1}).json()["data"]
        scored = chat(http, model_id, logprobs=True, max_tokens=1)
        embedded = http.post("/v1/embeddings", json={"model": model_id, "input": "the sea"})
        assert embedded.status_code == 200, embedded.text
        for response in (scored, embedded):
            assert "x-millm-probe-verdicts" not in response.headers
            assert "millm_probe_verdicts" not in response.json()
        assert http.get("/api/probes/events", params={"limit": 1}).json()["data"] == before


def test_a_window_with_no_positions_says_so(probes_server, armed_pair, model_id):
    with probes_server.http() as http:
        results = chat(http, model_id, max_tokens=1).json()["millm_probe_verdicts"]
    response = next(r for r in results if r["window"] == "response")
    assert (response["outcome"], response["reason"], response["scored"]) == ("skipped", "no_scored_tokens", False)


def test_traceparent_joins_the_callers_trace(probes_server, armed_pair, model_id):
    with probes_server.http() as http:
        joined = chat(http, model_id, headers={"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01"})
        assert {r["trace_id"] for r in joined.json()["millm_probe_verdicts"]} == {TRACE_ID}
        for bad in (
            "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
            "garbage",
            f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",
            f"00-{TRACE_ID}-00f067aa0ba902b7-01,00-{TRACE_ID}-00f067aa0ba902b8-01",
        ):
            minted = chat(http, model_id, headers={"traceparent": bad}).json()["millm_probe_verdicts"]
            [trace] = {r["trace_id"] for r in minted}
            assert trace != TRACE_ID and re.fullmatch(r"[0-9a-f]{32}", trace)
        stored = http.get("/api/probes/events", params={"trace_id": TRACE_ID}).json()["data"]
        assert {r["result_id"] for r in stored} >= {r["result_id"] for r in joined.json()["millm_probe_verdicts"]}


def test_events_list_filters_pages_and_detail(probes_server, armed_pair, model_id, lab):
    with probes_server.http() as http:
        results = chat(http, model_id).json()["millm_probe_verdicts"]
        one = next(r for r in results if r["window"] == "prompt")
        listed = http.get(
            "/api/probes/events", params={"probe_id": armed_pair[0], "window": "prompt", "limit": 500}
        ).json()["data"]
        assert all(e["probe_id"] == armed_pair[0] and e["window"] == "prompt" for e in listed)
        assert one in listed
        fired = http.get("/api/probes/events", params={"fired": "true", "limit": 500}).json()["data"]
        assert fired and all(e["fires"] is True for e in fired)
        assert all("detail" not in e for e in listed + fired)  # text only on the detail route

        first = http.get("/api/probes/events", params={"limit": 2}).json()
        assert len(first["data"]) == 2 and first["has_more"] is True
        second = http.get("/api/probes/events", params={"limit": 2, "after": first["last_id"]}).json()
        assert not {e["result_id"] for e in first["data"]} & {e["result_id"] for e in second["data"]}
        assert first["data"][0]["result_id"] > second["data"][0]["result_id"]  # newest first, v7 ids sort by time

        assert one["fires"] is True  # decoded context is kept only for a result that fired
        unfired = next(r for r in results if r["fires"] is not True)
        assert http.get(f"/api/probes/events/{unfired['result_id']}").json()["detail"] is None
        detail = http.get(f"/api/probes/events/{one['result_id']}").json()
        assert {k: v for k, v in detail.items() if k != "detail"} == one
        text = detail["detail"]
        prompt = lab.chat_ids(CHAT)
        ids = prompt + lab.greedy(prompt, 5)  # what the request above read
        top = text["top_position"]
        assert top < len(prompt)  # the prompt window's top position
        assert (text["context_start"], text["context_end"]) == (max(0, top - 16), min(len(ids), top + 17))
        assert text["top_token"] == lab.tokenizer.decode([ids[top]])
        assert text["context_text"] == lab.tokenizer.decode(
            ids[text["context_start"] : text["context_end"]], skip_special_tokens=True
        )
        assert http.get("/api/probes/events/nope").status_code == 404
        assert http.get("/api/probes/events", params={"fired": "maybe"}).status_code == 400
        assert http.get("/api/probes/events", params={"limit": "0"}).status_code == 400
        assert http.get("/api/probes/events", params={"window": "middle"}).status_code == 400


def test_status_reports_the_last_overhead(probes_server, armed_pair, model_id):
    with probes_server.http() as http:
        chat(http, model_id)
        status = http.get("/api/probes/status").json()
    assert [p["probe_id"] for p in status["armed"]] == armed_pair
    assert all(p["quiet"] is False and p["last_result"]["outcome"] == "completed" for p in status["armed"])
    last = status["last_request"]
    assert last["device_to_host_copies"] == 1  # two probes on two layers, one copy
    assert last["forward_passes"] == 5 and last["results"] == 4
    assert 0 < last["overhead_ms"] and status["overhead_warning_ms"] == 5.0


def test_verdict_fires_at_the_bar_and_length_bands_move_it(probes_server, lab, identity, model_id, helpers):
    with probes_server.http() as http:
        doc = lab.definition(identity, name="bar", rule="mean", windows=["all"])
        probe = helpers.import_probe(http, doc)
        try:
            helpers.arm(http, probe["id"])
            ids = lab.chat_ids(CHAT)
            stateless = http.post(
                "/api/probes/score", json={"probe_ids": [probe["id"]], "inputs": [{"token_ids": ids}]}
            ).json()
            score = stateless["results"][0]["results"][0]["score"]

            def cut(threshold, bands=None):
                decision = {"threshold": threshold, "threshold_source": "test", "length_bands": bands}
                response = http.post(
                    f"/api/probes/{probe['id']}/recalibrate",
                    json={"provenance": {"probe_id": "prb_bar"}, "decision": decision},
                )
                assert response.status_code == 200, response.text

            def verdict():
                result = http.post(
                    "/api/probes/score", json={"probe_ids": [probe["id"]], "inputs": [{"token_ids": ids}]}
                ).json()
                return result["results"][0]["results"][0]

            cut(score)  # exactly on the bar fires
            on_bar = verdict()
            assert on_bar["verdict"] is True and on_bar["threshold"] == score
            assert (on_bar["decision_revision"], on_bar["threshold_revision"]) == (2, 2)
            cut(score + 1e-9)
            assert verdict()["verdict"] is False
            cut(
                score + 1e-9,
                bands=[
                    {"max_tokens": len(ids) - 1, "threshold": 1e9},
                    {"max_tokens": len(ids), "threshold": score - 1},
                ],
            )
            banded = verdict()
            assert banded["threshold"] == score - 1 and banded["verdict"] is True
            on_prompt = chat(http, model_id, max_tokens=1).json()["millm_probe_verdicts"][0]
            assert on_prompt["n_scored_tokens"] == len(ids) and on_prompt["threshold"] == score - 1
            longer = chat(http, model_id, max_tokens=3).json()["millm_probe_verdicts"][0]
            assert longer["decision_revision"] == 4 and longer["threshold"] == score + 1e-9  # no band fits
        finally:
            http.post(f"/api/probes/{probe['id']}/disarm")
            http.delete(f"/api/probes/{probe['id']}")


def test_results_of_a_deleted_probe_remain(probes_server, lab, identity, model_id, helpers):
    with probes_server.http() as http:
        probe = helpers.import_probe(http, lab.definition(identity, name="ephemeral"))
        helpers.arm(http, probe["id"])
        results = chat(http, model_id).json()["millm_probe_verdicts"]
        http.post(f"/api/probes/{probe['id']}/disarm")
        http.delete(f"/api/probes/{probe['id']}")
        mine = [r for r in results if r["probe_id"] == probe["id"]]
        stored = http.get("/api/probes/events", params={"probe_id": probe["id"]}).json()["data"]
        assert [r["result_id"] for r in stored] == [r["result_id"] for r in mine]
