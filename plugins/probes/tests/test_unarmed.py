"""With nothing armed, the plugin is invisible: no hook, no header, no body field, no chunk."""

from __future__ import annotations

import re

import pytest

CHAT = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def plain_server(app_factory, probe_model_dir):
    """The same model in an app without the probes plugin (in-process, like ``probes_server``)."""
    return app_factory(plugins="all", checkpoint=probe_model_dir, env={"MILLM_DISABLE_PLUGINS": "probes"})


def exchange(server, model_id: str, **extra) -> tuple[str, dict[str, str]]:
    """A response's body and headers, with what differs between any two responses taken out."""
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"model": model_id, "messages": CHAT, "max_tokens": 5, "temperature": 0, **extra},
        )
        assert response.status_code == 200, response.text
        text = response.text
    text = re.sub(r'"(chatcmpl-)[0-9a-f]+"', r'"\1"', text)
    text = re.sub(r'"created": ?\d+', '"created": 0', text)
    text = re.sub(r'"cached_tokens": ?\d+', '"cached_tokens": 0', text)  # what this server's prefix cache held
    headers = {k: v for k, v in response.headers.items() if k not in ("date", "content-length")}
    return text, headers


def test_an_unarmed_response_is_byte_identical(probes_server, plain_server, model_id):
    with probes_server.http() as http:
        assert http.get("/api/probes/status").json()["armed"] == []
        before = http.get("/api/probes/events", params={"limit": 1}).json()["data"]
    assert exchange(probes_server, model_id) == exchange(plain_server, model_id)
    streamed = exchange(probes_server, model_id, stream=True)
    assert "millm_probe_verdicts" not in streamed[0]
    assert re.sub(r'"id":"chatcmpl-[0-9a-f]+"', "", streamed[0]) == re.sub(
        r'"id":"chatcmpl-[0-9a-f]+"', "", exchange(plain_server, model_id, stream=True)[0]
    )
    with probes_server.http() as http:
        assert http.get("/api/probes/events", params={"limit": 1}).json()["data"] == before  # nothing recorded
