"""Access control: API and admin keys, Host names, cross-site requests, CORS, SAE paths, operator names."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import openai
import pytest

from millm_host.access import Access
from millm_host.settings import Settings
from millm_host.testing import assert_error, chat_body

USER_KEY, ADMIN_KEY = "user-key-1", "admin-key-1"
APP_ORIGIN = "http://app.example:3000"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def sae_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sae-root")


@pytest.fixture(scope="module")
def guarded(app_factory, tiny_model_dir, sae_root):
    """An app with every installed plugin on the tiny model, in-process, with both kinds of keys, one CORS
    origin and its own SAE directory."""
    return app_factory(
        plugins="all",
        models={},
        model=str(tiny_model_dir),
        env={
            "MILLM_API_KEYS": f"{USER_KEY},second-user-key",
            "MILLM_ADMIN_API_KEYS": ADMIN_KEY,
            "MILLM_CORS_ORIGINS": APP_ORIGIN,
            "MILLM_SAE_DIRS": str(sae_root),
        },
    )


@pytest.fixture
def model_id(guarded) -> str:
    return guarded.model_id


# --- keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {},
        bearer("wrong"),
        {"Authorization": f"Basic {USER_KEY}"},
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {USER_KEY}x"},
    ],
)
def test_v1_refuses_a_missing_or_wrong_key(guarded, model_id, headers):
    with guarded.http() as http:
        for response in (
            http.get("/v1/models", headers=headers),
            http.post("/v1/chat/completions", headers=headers, json=chat_body(model_id, max_tokens=1)),
        ):
            assert_error(response, 401, "invalid_api_key")
            assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("key", [USER_KEY, "second-user-key", ADMIN_KEY])
def test_v1_takes_an_api_key_or_an_admin_key(guarded, model_id, key):
    with guarded.http() as http:
        assert http.get("/v1/models", headers=bearer(key)).status_code == 200
        reply = http.post("/v1/chat/completions", headers=bearer(key), json=chat_body(model_id, max_tokens=1))
    assert reply.status_code == 200, reply.text


def test_anthropics_x_api_key_is_a_key_too(guarded, model_id):
    """Anthropic's SDKs send ``X-Api-Key``; ``/v1/messages`` refuses a wrong one in Anthropic's shape."""
    body = {"model": model_id, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    with guarded.http() as http:
        assert http.get("/v1/models", headers={"X-Api-Key": USER_KEY}).status_code == 200
        assert http.post("/v1/messages", headers={"X-Api-Key": USER_KEY}, json=body).status_code == 200
        wrong = http.post("/v1/messages", headers={"X-Api-Key": "wrong"}, json=body)
        both = http.post("/v1/messages", headers={"X-Api-Key": USER_KEY, **bearer("wrong")}, json=body)
    assert wrong.status_code == both.status_code == 401  # Authorization, when sent, is the one checked
    assert wrong.json()["type"] == "error" and wrong.json()["error"]["type"] == "authentication_error"


def test_the_openai_sdk_sends_its_key(guarded, model_id):
    with pytest.raises(openai.AuthenticationError):
        guarded.openai().models.list()  # api_key="not-needed"
    client = openai.OpenAI(base_url=guarded.v1, api_key=USER_KEY, max_retries=0)
    reply = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert reply.choices[0].message.role == "assistant"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/models", None),
        ("POST", "/api/models/{model}/unload", None),
        ("GET", "/api/saes", None),  # a plugin's route, guarded without the plugin doing anything
        ("POST", "/api/saes", {"path": "x"}),
        ("GET", "/api/probes/status", None),
        ("POST", "/api/profiles/deactivate", None),
    ],
)
def test_management_routes_need_the_admin_key(guarded, model_id, method, path, body):
    path = path.format(model=model_id)
    with guarded.http() as http:
        for headers in ({}, bearer(USER_KEY), bearer("wrong")):
            assert_error(http.request(method, path, json=body, headers=headers), 401, "invalid_api_key")
        assert http.get("/api/health").json()["status"] == "ok"  # nothing was unloaded
        assert http.get("/api/models", headers=bearer(ADMIN_KEY)).status_code == 200


def test_health_and_the_api_description_stay_open(guarded):
    with guarded.http() as http:
        assert http.get("/api/health").status_code == 200
        assert http.get("/openapi.json").status_code == 200


@pytest.mark.parametrize(
    ("environ", "v1", "api"),
    [
        ({}, None, None),  # off by default
        ({"MILLM_API_KEYS": "u"}, [b"u"], [b"u"]),  # management is never left open once keys are set
        ({"MILLM_ADMIN_API_KEYS": "a"}, None, [b"a"]),  # inference open, management locked
        ({"MILLM_API_KEYS": "u", "MILLM_ADMIN_API_KEYS": "a"}, [b"u", b"a"], [b"a"]),
    ],
)
def test_which_keys_open_which_routes(environ, v1, api):
    access = Access(Settings(environ=environ))
    assert access.keys_for("/v1/chat/completions") == v1
    assert access.keys_for("/api/models") == api
    assert access.keys_for("/api/health") is None and access.keys_for("/openapi.json") is None


def test_settings_never_print_keys():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "millm_host.cli", "settings"],
        capture_output=True,
        text=True,
        env={**os.environ, "MILLM_API_KEYS": "sekrit-1", "MILLM_ADMIN_API_KEYS": "sekrit-2"},
        timeout=120,
    ).stdout
    assert "MILLM_API_KEYS=<set>" in out and "MILLM_ADMIN_API_KEYS=<set>" in out and "sekrit" not in out


# --- Host, Origin, media type, CORS -------------------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", "localhost.evil.example"])
def test_an_unknown_host_is_refused(tiny_server, host):
    with tiny_server.http() as http:
        assert_error(http.get("/api/health", headers={"Host": host}), 400, "host_not_allowed", "Host")
        # (state-changing refusals are shown on a model that does not exist, so the shared server is never touched)
        assert_error(http.post("/api/models/absent/unload", headers={"Host": host}), 400, "host_not_allowed")


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "LOCALHOST:80", "127.0.0.1", "[::1]:9"])
def test_loopback_names_are_answered(tiny_server, host):
    with tiny_server.http() as http:
        assert http.get("/api/health", headers={"Host": host}).status_code == 200


def test_allowed_hosts_can_be_configured():
    access = Access(Settings(environ={"MILLM_ALLOWED_HOSTS": "gpu-box.lan,api.example:8443"}))
    assert access.host_allowed("gpu-box.lan:8000") and access.host_allowed("api.example:8443")
    assert not access.host_allowed("api.example:80") and not access.host_allowed("localhost")
    assert Access(Settings(environ={"MILLM_ALLOWED_HOSTS": "*"})).host_allowed("anything")
    bound = Access(Settings(environ={}), bind_host="192.168.1.5")  # the address --host names is answered
    assert bound.host_allowed("192.168.1.5:8000") and bound.host_allowed("localhost")


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a body and no Content-Type: once parsed as JSON
        {"Content-Type": "text/plain"},  # what a cross-site <form enctype="text/plain"> sends
        {"Content-Type": "application/x-www-form-urlencoded"},
        {"Content-Type": "multipart/form-data; boundary=x"},
    ],
)
def test_a_state_change_needs_a_json_body(tiny_server, headers):
    model = tiny_server.model_id
    body = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}' % model.encode()
    with tiny_server.http() as http:
        assert_error(
            http.post("/v1/chat/completions", content=body, headers=headers),
            415,
            "unsupported_media_type",
            "Content-Type",
        )
        assert_error(
            http.post("/api/models/absent/load", content=b"{}", headers=headers), 415, "unsupported_media_type"
        )
        ok = http.post(
            "/v1/chat/completions", content=body, headers={"Content-Type": "application/json; charset=utf-8"}
        )
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:1"])
def test_a_cross_site_state_change_is_refused(tiny_server, origin):
    """The body-less POST a page can send with fetch(..., {mode: "no-cors"}) carries its Origin."""
    with tiny_server.http() as http:
        response = http.post("/api/models/absent/unload", headers={"Origin": origin})
        assert_error(response, 403, "cross_origin_refused", "Origin")
        assert http.get("/v1/models", headers={"Origin": origin}).status_code == 200  # reads: CORS decides


def test_a_same_origin_state_change_is_allowed(guarded):
    with guarded.http() as http:
        response = http.post("/api/profiles/deactivate", headers={"Origin": guarded.base_url, **bearer(ADMIN_KEY)})
    assert response.status_code == 200, response.text


def test_cors_is_off_unless_configured(tiny_server, guarded):
    preflight = {
        "Origin": APP_ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    with tiny_server.http() as http:
        off = http.options("/v1/chat/completions", headers=preflight)
        assert "access-control-allow-origin" not in off.headers
        assert "access-control-allow-origin" not in http.get("/v1/models", headers={"Origin": APP_ORIGIN}).headers
    with guarded.http() as http:
        on = http.options("/v1/chat/completions", headers=preflight)
        assert on.headers["access-control-allow-origin"] == APP_ORIGIN
        assert "authorization" in on.headers["access-control-allow-headers"].lower()
        other = http.options("/v1/chat/completions", headers={**preflight, "Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        # The configured origin may change state (with the admin key); others may not.
        allowed = http.post("/api/profiles/deactivate", json={}, headers={"Origin": APP_ORIGIN, **bearer(ADMIN_KEY)})
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == APP_ORIGIN
        refused = http.post(
            "/api/profiles/deactivate", json={}, headers={"Origin": "http://evil.example", **bearer(ADMIN_KEY)}
        )
        assert_error(refused, 403, "cross_origin_refused")


# --- SAE paths --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sae_in_root(sae_root) -> Path:
    from millm_saelens.testing import write_sae

    return write_sae(sae_root / "inside", d_in=64, d_sae=32, layer=0)


def _register(guarded, body):
    with guarded.http() as http:
        return http.post("/api/saes", json=body, headers=bearer(ADMIN_KEY))


def _forget(guarded, sae_id):
    with guarded.http() as http:
        http.delete(f"/api/saes/{sae_id}", headers=bearer(ADMIN_KEY))


def test_paths_outside_the_sae_dirs_are_refused_alike(guarded, tmp_path):
    """Whether a path outside exists, is a directory or is an SAE, the answer is the same."""
    from millm_saelens.testing import write_sae

    outside_sae = write_sae(tmp_path / "outside", d_in=64, d_sae=32, layer=0)
    messages = set()
    for path in ("/etc", "/nonexistent/sae", str(outside_sae), "/"):
        error = assert_error(_register(guarded, {"path": path}), 400, "invalid_parameter", "path")
        messages.add(error["message"])
    assert len(messages) == 1 and "MILLM_SAE_DIRS" in messages.pop()


@pytest.mark.parametrize("path", ["../sae-root/inside", "inside/../../etc", "~/inside", "~root", "a\x00b"])
def test_traversal_and_home_expansion_are_refused(guarded, sae_in_root, path):
    assert_error(_register(guarded, {"path": path}), 400, "invalid_parameter", "path")


def test_a_link_out_of_the_sae_dirs_is_refused(guarded, sae_root, tmp_path):
    from millm_saelens.testing import write_sae

    target = write_sae(tmp_path / "elsewhere", d_in=64, d_sae=32, layer=0)
    link = sae_root / "link-out"
    link.symlink_to(target, target_is_directory=True)
    assert_error(_register(guarded, {"path": str(link)}), 400, "invalid_parameter", "path")
    assert_error(_register(guarded, {"path": "link-out"}), 400, "invalid_parameter", "path")


def test_an_sae_inside_registers_by_absolute_or_relative_path(guarded, sae_in_root):
    for body in ({"path": str(sae_in_root), "sae_id": "by-absolute"}, {"path": "inside", "sae_id": "by-relative"}):
        response = _register(guarded, body)
        try:
            assert response.status_code == 200, response.text
            assert response.json()["path"] == str(sae_in_root.resolve())
        finally:
            _forget(guarded, body["sae_id"])


def test_an_overlong_path_component_is_a_400(guarded):
    assert_error(_register(guarded, {"path": "x" * 300}), 400, "invalid_parameter", "path")


# --- names shown to operators -------------------------------------------------------------------

HIDDEN = [
    "bell\x07",
    "c1\x85",
    "bidi\u202eevil",
    "isolate\u2066x",
    "zero\u200bwidth",
    "joiner\u200dx",
    "bom\ufeff",
    "line\u2028sep",
    "mark\u200e",
]


@pytest.mark.parametrize("name", HIDDEN)
def test_profile_names_refuse_hidden_characters(guarded, name):
    body = {"name": name, "sae_id": "whatever", "features": [{"index": 1, "strength": 1.0}]}
    with guarded.http() as http:
        error = assert_error(
            http.post("/api/profiles", json=body, headers=bearer(ADMIN_KEY)), 400, "invalid_parameter", "name"
        )
    assert "U+" in error["message"]


@pytest.mark.parametrize("sae_id", ["bidi\u202eevil", "zero\u200bwidth", "tab\tid"])
def test_sae_ids_refuse_hidden_characters(guarded, sae_in_root, sae_id):
    error = assert_error(_register(guarded, {"path": "inside", "sae_id": sae_id}), 400, "invalid_parameter", "sae_id")
    assert "U+" in error["message"]


def test_a_plain_unicode_name_is_fine():
    from millm_host.naming import check_display_name

    for name in ("détecteur", "探测器", "naïve café", "emoji 🙂"):
        assert check_display_name(name, "name") == name


def test_requests_without_keys_are_unaffected_by_default(tiny_server):
    """The loopback default: no key needed (the SDK's dummy key is ignored)."""
    assert tiny_server.openai().models.list().data
    with httpx.Client(base_url=tiny_server.base_url) as http:
        assert http.get("/api/models").status_code == 200


def test_settings_are_listed_with_secrets_and_passwords_hidden(app_factory):
    """``GET /api/settings`` (Settings → Environment): what is in force, behind the admin key."""
    env = {
        "MILLM_API_KEYS": "user-key",
        "MILLM_ADMIN_API_KEYS": "admin-key",
        "MILLM_DATABASE_URL": "sqlite:////tmp/x.db",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:s3cret@collector:4318",
    }
    app = app_factory(env=env)
    with app.http() as http:
        assert http.get("/api/settings", headers={"Authorization": "Bearer user-key"}).status_code == 401
        body = http.get("/api/settings", headers={"Authorization": "Bearer admin-key"}).json()
    found = {s["name"]: s for s in body["data"]}
    assert found["MILLM_ADMIN_API_KEYS"]["value"] is True and found["MILLM_ADMIN_API_KEYS"]["secret"]
    assert "admin-key" not in str(body) and "user-key" not in str(body) and "s3cret" not in str(body)
    assert found["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://otel:***@collector:4318"
    assert (
        found["MILLM_QUEUE_MAX"]["set"] is False
        and found["MILLM_QUEUE_MAX"]["value"] == found["MILLM_QUEUE_MAX"]["default"]
    )
