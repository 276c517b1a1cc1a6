"""/v1/models, /api/health and the OpenAPI document (in-process, on the echo engine)."""

from __future__ import annotations

from millm_host.testing import assert_error
from millm_host.testing.openai_schema import validate_openai


def test_models_list_matches_openai_schema(echo_app):
    with echo_app.http() as http:
        body = http.get("/v1/models").json()
        validate_openai("ListModelsResponse", body)
        model_id = body["data"][0]["id"]
        one = http.get(f"/v1/models/{model_id}")
        missing = http.get("/v1/models/not-a-model")
    assert one.status_code == 200
    validate_openai("Model", one.json())
    assert one.json()["id"] == model_id
    assert_error(missing, 404, "model_not_found", "model")


def test_sdk_lists_and_retrieves(echo_app):
    client = echo_app.openai()
    models = client.models.list().data
    assert client.models.retrieve(models[0].id).id == models[0].id


def test_health_reports_model_engine_and_plugins(app_factory):
    app = app_factory(plugins="all")
    with app.http() as http:
        health = http.get("/api/health").json()
    assert health["status"] == "ok"
    assert health["engine"] == "echo" and health["model"] == "echo"
    assert {"echo", "transformers"} <= set(health["engines"])
    assert health["engine_status"] == {}  # in process: nothing to report (the GGUF engine reports its child)
    names = {p["name"] for p in health["plugins"]}
    assert {"engine_transformers", "detector_example"} <= names
    assert all(p["version"] for p in health["plugins"])
    assert health["failed_plugins"] == []


def test_unknown_route_is_openai_shaped(echo_app):
    with echo_app.http() as http:
        response = http.get("/v1/nothing-here")
        wrong_method = http.get("/v1/chat/completions")
    assert_error(response, 404, "not_found")
    assert_error(wrong_method, 405, "method_not_allowed")


def test_openapi_document_describes_the_endpoints(echo_app):
    with echo_app.http() as http:
        doc = http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models"} <= set(doc["paths"])
    assert "ChatCompletionRequest" in doc["components"]["schemas"]
