"""Model names: a Hugging Face repository id is an alias of the one model made from it; a 404 names the models.

In-process on the echo engine; the default model's own alias is checked on a real server in
``test_real_model.py``.
"""

from __future__ import annotations

import pytest

from millm_host.testing import assert_error, chat


@pytest.fixture(scope="module")
def named(app_factory):
    return app_factory(
        models={
            "echo": {"hf_id": "Org/Echo-1"},
            "echo-b": {"hf_id": "Org/Shared"},
            "echo-c": {"hf_id": "Org/Shared"},
        }
    )


def test_a_repository_id_names_its_one_model(named):
    reply = named.openai().chat.completions.create(model="Org/Echo-1", messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "echo"  # answered under the model's id
    with named.http() as http:
        response = chat(http, "Org/Echo-1")
        embedded = http.post("/v1/embeddings", json={"model": "Org/Echo-1", "input": "hi"})
    assert response.headers["x-millm-model"] == "echo"
    assert embedded.json()["model"] == "echo"


def test_models_list_ids_only(named):
    with named.http() as http:
        ids = [m["id"] for m in http.get("/v1/models").json()["data"]]
    assert sorted(ids) == ["echo", "echo-b", "echo-c"]


def test_a_repository_of_several_models_is_ambiguous_naming_them(named):
    with named.http() as http:
        error = assert_error(chat(http, "Org/Shared"), 400, "AMBIGUOUS_MODEL_NAME", "model")
    assert "'Org/Shared'" in error["message"] and "echo-b, echo-c" in error["message"]


def test_unknown_model_404_names_the_models_that_exist(named):
    with named.http() as http:
        for response in (
            chat(http, "gpt-4o"),
            http.post("/v1/embeddings", json={"model": "gpt-4o", "input": "hi"}),
            http.get("/api/models/gpt-4o"),
        ):
            error = assert_error(response, 404, "model_not_found", "model")
            assert "'gpt-4o'" in error["message"]
            assert "'echo', 'echo-b', 'echo-c'" in error["message"], error


def test_a_long_list_of_models_is_cut_short(app_factory):
    app = app_factory(models={f"m{i:02d}": {} for i in range(25)}, model="m00")
    with app.http() as http:
        error = assert_error(chat(http, "nope"), 404, "model_not_found", "model")
    assert "'m19'" in error["message"] and "'m20'" not in error["message"]
    assert "and 5 more (GET /v1/models)" in error["message"]
