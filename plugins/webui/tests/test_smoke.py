"""The UI is served, escapes what it shows, and stays behind the admin key (a real server, a real browser)."""

from __future__ import annotations

import json

import httpx
import pytest


@pytest.fixture(scope="module")
def sae_root(tmp_path_factory):
    """The server's ``MILLM_SAE_DIRS``: an SAE and its Neuronpedia label export."""
    from millm_saelens.testing import write_sae

    root = tmp_path_factory.mktemp("ui-saes")
    write_sae(root / "ui-sae", d_in=64, d_sae=32, layer=0)
    export = [
        {"modelId": "probe-llama", "layer": "0-res", "index": "5", "description": "cats and kittens"},
        {"modelId": "probe-llama", "layer": "0-res", "index": "9", "description": "Python function definitions"},
    ]
    (root / "export.json").write_text(json.dumps(export), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def server(server_factory, ui_model_dir, ui_env, sae_root):
    return server_factory(ui_model_dir, env=ui_env(MILLM_SAE_DIRS=str(sae_root)))


def test_the_overview_page_lists_every_page_and_the_root_redirects(server, ui_page):
    page = ui_page(server)
    page.goto("/")
    assert page.page.url == server.base_url + "/ui"
    assert page.page.locator("h1").inner_text() == "Overview"
    nav = page.page.locator("header nav a").all_inner_texts()
    assert nav[:3] == ["Playground", "Overview", "Models"]
    assert page.page.locator("#health-status").inner_text() == "ok"
    page.shot("overview")


def test_pages_are_html_and_listed_in_the_api_description(server):
    response = httpx.get(server.base_url + "/ui/models")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    paths = httpx.get(server.base_url + "/openapi.json").json()["paths"]
    assert paths["/ui/models"]["get"]["responses"]["200"]["content"] == {"text/html": {"schema": {"type": "string"}}}


def test_measure_approve_and_override_the_probe_capacity(server, ui_page):
    page = ui_page(server)
    page.goto("/ui/models")
    card = page.page.locator("section.model", has_text="probe-llama")
    assert "Fallback budgets (not measured)" in card.inner_text()
    card.locator("button", has_text="Measure").click()
    page.settled(card.locator("button", has_text="Approve"), timeout=120_000)  # a recommendation, once measured
    card = page.page.locator("section.model", has_text="probe-llama")
    assert "Fallback budgets" not in card.inner_text() and "Recommendation:" in card.inner_text()
    card.locator("button", has_text="Approve").click()
    page.settled(page.page.locator("section.model", has_text="probe-llama").locator(".limits", has_text="approved"))
    card = page.page.locator("section.model", has_text="probe-llama")
    card.locator("form.override input[name=pct]").fill("7.5")
    card.locator("form.override button").click()
    page.page.locator("section.model", has_text="probe-llama").locator(".limits", has_text="override").wait_for()
    with httpx.Client(base_url=server.base_url) as http:
        model_id = http.get("/api/health").json()["model"]
        stored = http.get(f"/api/models/{model_id}/probe-capacity").json()["stored_limits"]
    assert stored["pct"] == 7.5
    page.shot("capacity")


def test_feature_labels_are_imported_searched_and_shown(server, ui_page, sae_root):
    with httpx.Client(base_url=server.base_url) as http:
        http.post("/api/saes", json={"path": str(sae_root / "ui-sae"), "sae_id": "ui-sae"}).raise_for_status()
        features = [{"index": 5, "strength": 1.0}]
        http.post(
            "/api/profiles", json={"name": "ui-cats", "sae_id": "ui-sae", "features": features}
        ).raise_for_status()
    try:
        page = ui_page(server)
        page.goto("/ui/steering")
        form = page.page.locator("#import-labels")
        form.locator("select[name=sae_id]").select_option("ui-sae")
        form.locator("input[name=file]").set_input_files(str(sae_root / "export.json"))  # uploaded as content
        form.locator("button").click()
        shown = page.settled(page.page.locator("#profiles .feature-label", has_text="cats and kittens"))
        assert "#5" in page.page.locator("#profiles tr[data-profile='ui-cats']").inner_text() and shown.is_visible()
        search = page.page.locator("#search-labels")
        search.locator("input[name=q]").fill("PYTHON")
        search.locator("button").click()
        results = page.settled(page.page.locator("#label-results"))
        assert "Python function definitions" in results.inner_text() and "cats" not in results.inner_text()
        page.shot("feature-labels")
    finally:
        with httpx.Client(base_url=server.base_url) as http:
            http.delete("/api/profiles/ui-cats")
            http.delete("/api/saes/ui-sae")
