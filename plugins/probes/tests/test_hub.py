"""Browse Hub (``/api/probes/hub/…``) against a real local HTTP server that answers the Hub API routes
huggingface_hub calls (``millm_host.testing.hub.LocalHub``): search by the tag, a repo's definitions
with their rungs, one import through the file import's checks; hostile names, sizes and hubs."""

from __future__ import annotations

import copy
import json
import os
import threading

import httpx
import pytest
import schemathesis
from huggingface_hub import HfApi
from hypothesis import HealthCheck, settings
from schemathesis import checks

from millm_host.testing import assert_error
from millm_host.testing.hub import LocalHub
from millm_host.testing.server import free_port

TAG = "mistudio-probe-definition"
checks.load_all_checks()
FUZZ_CHECKS = [check for check in checks.CHECKS.get_all() if check is not checks.positive_data_acceptance]
LIMIT = 64 * 1024  # MILLM_MAX_BODY_BYTES of these apps: a definition must fit it, as a file import must
IDENTITY = {
    "hf_id": "tests/hub-model",
    "revision": None,
    "d_model": 0,  # set from the lab's model
    "n_layers": 4,
    "chat_template_sha256": "0" * 64,
}


@pytest.fixture(scope="module")
def documents(lab):
    identity = {**IDENTITY, "d_model": lab.d_model, "n_layers": lab.n_layers}
    return {
        "stakes": lab.definition(identity, name="hub stakes", behaviour="hub-stakes", rung=2, vectors=1),
        "trained": lab.definition(identity, name="hub trained", behaviour="hub-stakes", rung=0, seed=3, vectors=1),
        "unstated": lab.definition(identity, name="hub unstated", rung=1, seed=4, vectors=1),
    }


@pytest.fixture(scope="module")
def hub(tmp_path_factory, documents):
    local = LocalHub(tmp_path_factory.mktemp("hub")).start()
    manifest = {
        "definitions": [{"filename": "stakes.probe.json", "rung": 2}, {"filename": "trained.probe.json", "rung": 0}]
    }
    local.add_repo(
        "acme/stakes-probes",
        {
            "stakes.probe.json": json.dumps(documents["stakes"]),
            "trained.probe.json": json.dumps(documents["trained"]),
            "more/unstated.probe.json": json.dumps(documents["unstated"]),
            "notes.txt": "not a definition",
            "manifest.json": json.dumps(manifest),
        },
        tags=[TAG],
    )
    local.add_repo("acme/no-manifest", {"unstated.probe.json": json.dumps(documents["unstated"])}, tags=[TAG])
    local.add_repo("acme/untagged", {"x.probe.json": "{}"}, tags=["other"])
    tampered = copy.deepcopy(documents["stakes"])
    tampered["name"] = "hub tampered"
    tampered["head"]["bias"] += 1.0  # the detector changed under the digest it carries
    broken_manifest = {"bad.probe.json": "not json {", "manifest.json": '{"definitions": {"no": "list"}}'}
    local.add_repo("acme/hostile", {"tampered.probe.json": json.dumps(tampered), **broken_manifest}, tags=[TAG])
    local.add_repo("acme/huge", {"huge.probe.json": "{}", "manifest.json": "{}"}, tags=[TAG])
    local.huge |= {"acme/huge/huge.probe.json", "acme/huge/manifest.json"}
    yield local
    local.stop()


@pytest.fixture(scope="module")
def app(app_factory, hub):
    return app_factory(
        plugins="all",
        env={"PROBE_HUB_ENDPOINT": hub.url, "PROBE_HUB_TIMEOUT_S": "2", "MILLM_MAX_BODY_BYTES": str(LIMIT)},
    )


@pytest.fixture
def api(app):
    """A client on the app; every probe a test imports is deleted after it."""
    with app.http() as http:
        before = {p["id"] for p in http.get("/api/probes").json()["data"]}
        yield http
        for probe in http.get("/api/probes").json()["data"]:
            if probe["id"] not in before:
                http.delete(f"/api/probes/{probe['id']}")


@pytest.fixture
def clean(hub):
    hub.fault = None
    yield hub
    hub.fault = None


def test_the_local_hub_speaks_what_huggingface_hub_reads(hub):
    """The fixture is checked against the library itself: list_models, model_info and list_repo_tree."""
    api = HfApi(endpoint=hub.url, token=False)
    assert {m.id for m in api.list_models(filter=TAG)} == {
        "acme/stakes-probes",
        "acme/no-manifest",
        "acme/hostile",
        "acme/huge",
    }
    info = api.model_info("acme/stakes-probes", files_metadata=True)
    assert info.sha == hub.commit("acme/stakes-probes")
    assert {s.rfilename for s in info.siblings} >= {"stakes.probe.json", "more/unstated.probe.json"}
    assert all(s.size for s in info.siblings)
    assert "manifest.json" in {f.path for f in api.list_repo_tree("acme/stakes-probes", recursive=True)}


def test_search_finds_tagged_repos_only_and_sends_no_token(api, clean, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_never_sent")  # anonymous: token=False whatever the environment says
    sent = len(clean.requests)
    answer = api.get("/api/probes/hub/search").json()
    assert answer["tag"] == TAG and answer["endpoint"] == clean.url
    assert [r["repo_id"] for r in answer["data"]] == [
        "acme/hostile",
        "acme/huge",
        "acme/no-manifest",
        "acme/stakes-probes",
    ]
    assert TAG in answer["data"][0]["tags"]
    assert [r["repo_id"] for r in api.get("/api/probes/hub/search", params={"q": "stakes"}).json()["data"]] == [
        "acme/stakes-probes"
    ]
    assert api.get("/api/probes/hub/search", params={"q": "nothing-like-it"}).json()["data"] == []
    requests = clean.requests[sent:]
    assert requests and all(r["method"] == "GET" for r in requests)  # read-only
    assert not any("authorization" in {k.lower() for k in r["headers"]} for r in requests)
    assert all(f"filter={TAG}" in r["path"] for r in requests)


def test_a_listing_shows_each_rung_from_the_manifest_or_says_it_is_not_stated(api, clean):
    answer = api.get("/api/probes/hub/definitions", params={"repo_id": "acme/stakes-probes"}).json()
    assert answer["revision"] == clean.commit("acme/stakes-probes") and answer["manifest"] == {"status": "found"}
    rows = {d["filename"]: d for d in answer["data"]}
    assert list(rows) == ["more/unstated.probe.json", "stakes.probe.json", "trained.probe.json"]  # no notes.txt
    assert (
        rows["stakes.probe.json"]["rung"] == 2
        and rows["stakes.probe.json"]["rung_language"] == "detects on unseen tasks"
    )
    # rung 0 is a claim (trained, nothing further measured); an unknown is said to be one
    assert rows["trained.probe.json"]["rung"] == 0 and rows["trained.probe.json"]["rung_stated"] is True
    assert rows["trained.probe.json"]["rung_language"] == "trained"
    assert rows["more/unstated.probe.json"]["rung"] is None and rows["more/unstated.probe.json"]["rung_stated"] is False
    assert rows["more/unstated.probe.json"]["rung_language"] == "rung not stated"
    assert rows["stakes.probe.json"]["size"] > 0

    bare = api.get("/api/probes/hub/definitions", params={"repo_id": "acme/no-manifest"}).json()
    assert bare["manifest"] == {"status": "absent"} and bare["data"][0]["rung_language"] == "rung not stated"
    hostile = api.get("/api/probes/hub/definitions", params={"repo_id": "acme/hostile"}).json()
    assert hostile["manifest"]["status"] == "invalid" and all(d["rung"] is None for d in hostile["data"])
    huge = api.get("/api/probes/hub/definitions", params={"repo_id": "acme/huge"}).json()
    assert huge["manifest"]["status"] == "invalid" and "bytes" in huge["manifest"]["reason"]
    assert_error(api.get("/api/probes/hub/definitions", params={"repo_id": "acme/missing"}), 404, "hub_not_found")


def test_import_one_definition_through_the_file_import_checks(api, clean, documents):
    raw = (clean.root / "acme/stakes-probes/stakes.probe.json").read_bytes()
    body = {
        "repo_id": "acme/stakes-probes",
        "filename": "stakes.probe.json",
        "revision": clean.commit("acme/stakes-probes"),
    }
    response = api.post("/api/probes/hub/import", json=body)
    assert response.status_code == 201, response.text
    probe = response.json()
    assert probe["name"] == "hub stakes" and probe["behaviour"] == "hub-stakes" and probe["armed"] is False
    assert probe["hub"] == {"endpoint": clean.url, **body}
    assert api.get(f"/api/probes/{probe['id']}/definition").content == raw  # stored verbatim
    assert probe["detector_digest_source"] == "producer"  # the identity block was verified

    assert_error(api.post("/api/probes/hub/import", json=body), 409, "PROBE_NAME_CONFLICT")
    renamed = api.post("/api/probes/hub/import", json=body, params={"on_conflict": "rename"})
    assert renamed.status_code == 201 and renamed.json()["name"] == "hub stakes (2)"

    count = len(api.get("/api/probes").json()["data"])
    tampered = {"repo_id": "acme/hostile", "filename": "tampered.probe.json"}
    error = assert_error(api.post("/api/probes/hub/import", json=tampered), 409, "PROBE_IDENTITY_MISMATCH")
    assert "detector_digest" in error["message"]
    bad = assert_error(
        api.post("/api/probes/hub/import", json={"repo_id": "acme/hostile", "filename": "bad.probe.json"}),
        400,
        "invalid_parameter",
        "filename",
    )
    assert "bad.probe.json from the Hub is not valid JSON" in bad["message"]
    missing = {"repo_id": "acme/stakes-probes", "filename": "gone.probe.json"}
    assert_error(api.post("/api/probes/hub/import", json=missing), 404, "hub_not_found")
    assert len(api.get("/api/probes").json()["data"]) == count  # nothing stored by a refusal


HOSTILE_REPOS = ["../etc", "a/b/c", "a" * 97, "ｆｕｌｌ/width", "acme/x\u202e", "acme/", "-acme/x", "acme/x.git", ""]
HOSTILE_FILES = [
    "../x.probe.json",
    "x.json",
    "/abs.probe.json",
    "a/../b.probe.json",
    "a\\b.probe.json",
    "x\u202e.probe.json",
    "a//b.probe.json",
    "x" * 600 + ".probe.json",
]


@pytest.mark.parametrize("repo_id", HOSTILE_REPOS)
def test_a_repo_id_that_is_not_valid_is_refused_before_the_hub_is_asked(api, clean, repo_id):
    sent = len(clean.requests)
    assert_error(
        api.get("/api/probes/hub/definitions", params={"repo_id": repo_id}), 400, "invalid_parameter", "repo_id"
    )
    body = {"repo_id": repo_id, "filename": "stakes.probe.json"}
    assert api.post("/api/probes/hub/import", json=body).status_code == 400
    assert len(clean.requests) == sent


@pytest.mark.parametrize("filename", HOSTILE_FILES)
def test_a_file_name_that_is_not_valid_is_refused_before_the_hub_is_asked(api, clean, filename):
    sent = len(clean.requests)
    body = {"repo_id": "acme/stakes-probes", "filename": filename}
    assert_error(api.post("/api/probes/hub/import", json=body), 400, "invalid_parameter", "filename")
    assert len(clean.requests) == sent


def test_other_bad_parameters_are_400s(api, clean):
    assert_error(api.get("/api/probes/hub/definitions"), 400, "invalid_parameter", "repo_id")
    params = {"repo_id": "acme/stakes-probes", "revision": "../main"}
    assert_error(api.get("/api/probes/hub/definitions", params=params), 400, "invalid_parameter", "revision")
    assert_error(api.get("/api/probes/hub/search", params={"limit": "500"}), 400, "invalid_parameter", "limit")
    assert_error(api.get("/api/probes/hub/search", params={"q": "x" * 201}), 400, "invalid_parameter", "q")
    assert_error(api.get("/api/probes/hub/search", params={"q": "a\u200bb"}), 400, "invalid_parameter", "q")
    body = {"repo_id": "acme/stakes-probes", "filename": "stakes.probe.json", "extra": 1}
    assert_error(api.post("/api/probes/hub/import", json=body), 400, "invalid_parameter")
    body = {"repo_id": "acme/stakes-probes", "filename": "stakes.probe.json"}
    params = {"on_conflict": "replace"}
    assert_error(api.post("/api/probes/hub/import", json=body, params=params), 400, "invalid_parameter", "on_conflict")


def test_a_definition_over_the_size_limit_is_cut_off_while_it_streams(api, clean):
    before = clean.huge_bytes_sent
    body = {"repo_id": "acme/huge", "filename": "huge.probe.json"}
    error = assert_error(api.post("/api/probes/hub/import", json=body), 502, "hub_response_too_large")
    assert str(LIMIT) in error["message"] and "MILLM_MAX_BODY_BYTES" in error["message"]
    # the reader hung up near the limit (socket buffers hold a few MiB more), never read the endless file
    assert clean.huge_bytes_sent - before < LIMIT + 16 * 1024 * 1024


@pytest.mark.parametrize(
    ("fault", "code", "words"),
    [("error", "hub_unavailable", "HTTP 503"), ("garbage", "hub_unavailable", "not JSON")],
)
def test_a_failing_hub_is_a_502_in_openai_shape(api, clean, fault, code, words):
    clean.fault = fault
    error = assert_error(api.get("/api/probes/hub/search"), 502, code)
    assert words in error["message"] and error["type"] == "server_error"
    assert api.get("/api/health").status_code == 200


def test_a_hanging_hub_times_out_with_a_504_and_the_server_keeps_serving(api, app, clean):
    clean.fault = "hang"
    answers: list[httpx.Response] = []

    def search() -> None:
        with app.http() as http:
            answers.append(http.get("/api/probes/hub/search"))

    threads = [threading.Thread(target=search) for _ in range(4)]
    for thread in threads:
        thread.start()
    while sum(1 for r in clean.requests[-4:] if "/api/models" in r["path"]) < 4 or len(clean.requests) < 4:
        threading.Event().wait(0.02)
    # four Hub reads hang in their threads; the loop still answers, and a fifth read is refused at once
    assert api.get("/api/health").status_code == 200
    assert api.get("/api/probes").status_code == 200
    assert all(thread.is_alive() for thread in threads)
    assert_error(api.get("/api/probes/hub/search"), 503, "hub_busy")
    for thread in threads:
        thread.join(30)
    assert [r.status_code for r in answers] == [504] * 4
    error = answers[0].json()["error"]
    assert error["code"] == "hub_timeout" and "PROBE_HUB_TIMEOUT_S" in error["message"]


def test_a_hub_that_is_down_is_a_502(app_factory):
    down = app_factory(plugins="all", env={"PROBE_HUB_ENDPOINT": f"http://127.0.0.1:{free_port()}"})
    with down.http() as http:
        error = assert_error(http.get("/api/probes/hub/search"), 502, "hub_unavailable")
        assert "could not reach the Hub" in error["message"]
        assert http.get("/api/health").status_code == 200


def test_an_endpoint_that_is_not_a_url_says_so(app_factory):
    misset = app_factory(plugins="all", env={"PROBE_HUB_ENDPOINT": "ftp://hub.example"})
    with misset.http() as http:
        error = assert_error(http.get("/api/probes/hub/search"), 503, "hub_not_configured")
        assert "PROBE_HUB_ENDPOINT" in error["message"]


# --- the routes fuzzed against their own description, on a real server and a working hub ----------
# (tests/test_openapi_fuzz.py fuzzes every other route; there the Hub is huggingface.co, unreachable)
@pytest.fixture(scope="module")
def hub_openapi(server_factory, hub):
    env = {"PROBE_HUB_ENDPOINT": hub.url, "PROBE_HUB_TIMEOUT_S": "5", "MILLM_LOAD_ON_START": "false"}
    server = server_factory(env=env, wait_for=None)
    hub.fault = None
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")


hub_schema = schemathesis.pytest.from_fixture("hub_openapi").include(path_regex="^/api/probes/hub/")


@hub_schema.parametrize()
@settings(
    max_examples=int(os.environ.get("MILLM_FUZZ_EXAMPLES", "25")),
    deadline=None,
    database=None,
    derandomize="MILLM_FUZZ_SEED" not in os.environ,
    suppress_health_check=list(HealthCheck),
)
def test_the_hub_routes_never_answer_5xx_on_a_working_hub(case):
    case.call_and_validate(checks=FUZZ_CHECKS, timeout=60)
