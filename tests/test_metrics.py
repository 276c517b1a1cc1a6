"""``/metrics``: Prometheus counts after known traffic (in-process, on the echo engine), parsed with prometheus_client."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from millm_host.testing import assert_error, chat_body


def scrape(http, **kwargs) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``/metrics``: (name, sorted labels) → value."""
    response = http.get("/metrics", **kwargs)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_requests_tokens_and_latencies_are_counted(app_factory):
    app = app_factory()
    with app.http() as http:
        ok = [http.post("/v1/chat/completions", json=chat_body("echo", "one two three")) for _ in range(3)]
        streamed = http.post("/v1/chat/completions", json=chat_body("echo", "four five", stream=True))
        refused = http.post("/v1/chat/completions", json=chat_body("echo", max_tokens=-1))
        unknown = http.post("/v1/chat/completions", json=chat_body("nope"))
        embedded = http.post("/v1/embeddings", json={"model": "echo", "input": "abc"})
        samples = scrape(http)
    assert all(r.status_code == 200 for r in ok) and streamed.status_code == 200 and embedded.status_code == 200
    assert_error(refused, 400, "invalid_parameter", "max_tokens")
    assert unknown.status_code == 404

    chat = {"endpoint": "chat.completions", "model": "echo"}
    assert value(samples, "millm_requests_total", **chat, status="200") == 4
    # refused before the model was resolved: no model label
    assert value(samples, "millm_requests_total", endpoint="chat.completions", model="", status="400") == 1
    assert value(samples, "millm_requests_total", endpoint="chat.completions", model="", status="404") == 1
    assert value(samples, "millm_requests_total", endpoint="embeddings", model="echo", status="200") == 1

    completion = sum(r.json()["usage"]["completion_tokens"] for r in ok)
    prompt = sum(r.json()["usage"]["prompt_tokens"] for r in ok)
    # the stream's tokens are counted too: at least one each
    counted_completion = value(samples, "millm_completion_tokens_total", **chat)
    counted_prompt = value(samples, "millm_prompt_tokens_total", **chat)
    assert completion < counted_completion and prompt < counted_prompt
    assert value(samples, "millm_prompt_tokens_total", endpoint="embeddings", model="echo") > 0

    # one first token per generated request, a gap per later token of a sequence: each of the four
    # ends at EOS, a token the engine made (timed) but not a completion token (not counted)
    assert value(samples, "millm_time_to_first_token_seconds_count", model="echo") == 4
    assert value(samples, "millm_inter_token_latency_seconds_count", model="echo") == counted_completion
    assert value(samples, "millm_request_duration_seconds_count", **chat) == 4
    assert value(samples, "millm_model_load_seconds_count", model="echo", engine="echo") == 1
    # nothing waits or runs once the answers are in
    assert value(samples, "millm_queue_depth") == 0 and value(samples, "millm_running_batch_size") == 0


def test_metrics_follow_the_admin_key(app_factory):
    app = app_factory(env={"MILLM_ADMIN_API_KEYS": "admin-key", "MILLM_API_KEYS": "user-key"})
    with app.http() as http:
        assert_error(http.get("/metrics"), 401, "invalid_api_key")
        assert_error(http.get("/metrics", headers={"Authorization": "Bearer user-key"}), 401, "invalid_api_key")
        scrape(http, headers={"Authorization": "Bearer admin-key"})


def test_metrics_can_be_turned_off(app_factory):
    app = app_factory(env={"MILLM_METRICS": "false"})
    with app.http() as http:
        assert http.post("/v1/chat/completions", json=chat_body("echo")).status_code == 200
        assert_error(http.get("/metrics"), 404, "not_found")


def test_a_plugin_names_its_own_series_and_scrapes_list_them(app_factory):
    """Plugins record through one generic API: a counter or histogram they name, the same series for
    the same name, never a method the host names for them."""
    import pytest

    app = app_factory()
    metrics = app.host.metrics
    hits = metrics.counter("millm_demo_hits", "Demo hits, by colour", ("colour",))
    assert metrics.counter("millm_demo_hits", "Demo hits, by colour", ("colour",)) is hits
    hits.inc(colour="red")
    hits.inc(2, colour="red")
    metrics.histogram("millm_demo_seconds", "Demo work", buckets=(0.1, 1.0)).observe(0.5)
    with pytest.raises(ValueError, match="millm_"):
        metrics.counter("demo_hits", "no prefix")
    with pytest.raises(ValueError, match="labels"):
        metrics.counter("millm_demo_hits", "Demo hits", ("shade",))
    with app.http() as http:
        samples = scrape(http)
    assert value(samples, "millm_demo_hits_total", colour="red") == 3
    assert value(samples, "millm_demo_seconds_bucket", le="1.0") == 1
