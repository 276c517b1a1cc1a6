"""A client generated from ``/openapi.json`` by openapi-python-client parses a real server's responses (issue 12 §5).

The client is generated offline into a temporary directory (no formatting hooks,
so it takes seconds) and imported from there; ``raise_on_unexpected_status``
makes a status the document does not list fail the test.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from millm_host.testing import chat_body

PACKAGE = "millm_openapi_client"


@pytest.fixture(scope="module")
def client_package(tiny_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("generated")
    with tiny_server.http() as http:
        (root / "openapi.json").write_text(json.dumps(http.get("/openapi.json").json()))
    (root / "config.json").write_text(json.dumps({"post_hooks": [], "package_name_override": PACKAGE}))
    subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(root / "openapi.json")]
        + ["--config", str(root / "config.json"), "--meta", "none", "--output-path", str(root / PACKAGE)],
        check=True,
        capture_output=True,
        cwd=root,
        timeout=300,
    )
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@pytest.fixture
def client(client_package, tiny_server):
    return client_package.Client(base_url=tiny_server.base_url, raise_on_unexpected_status=True, timeout=120)


def _api(name: str):
    return importlib.import_module(f"{PACKAGE}.api.default.{name}")


def _model(name: str):
    return getattr(importlib.import_module(f"{PACKAGE}.models"), name)


def test_generated_client_parses_a_chat_completion(client, tiny_server):
    request = _model("ChatCompletionRequest").from_dict(chat_body(tiny_server.model_id, max_tokens=4))
    reply = _api("post_v1_chat_completions").sync(client=client, body=request)
    assert isinstance(reply, _model("ChatCompletionResponse")), reply
    assert reply.object_ == "chat.completion"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.usage.completion_tokens >= 1


def test_generated_client_parses_the_models_list(client, tiny_server):
    listing = _api("get_v1_models").sync(client=client)
    assert isinstance(listing, _model("ModelList"))
    assert tiny_server.model_id in [m.id for m in listing.data]


def test_generated_client_parses_an_error(client):
    response = _api("get_v1_models_model_id").sync_detailed(client=client, model_id="no-such-model")
    assert response.status_code == 404
    assert isinstance(response.parsed, _model("ErrorResponse"))
    assert response.parsed.error.code == "model_not_found"
