"""The UI is served, escapes what it shows, and stays behind the admin key (a real server, a real browser)."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def server(server_factory, ui_model_dir, ui_env):
    return server_factory(ui_model_dir, env=ui_env())


def test_the_overview_page_lists_every_page_and_the_root_redirects(server, ui_page):
    page = ui_page(server)
    page.goto("/")
    assert page.page.url == server.base_url + "/ui"
    assert page.page.locator("h1").inner_text() == "Overview"
    nav = page.page.locator("header nav a").all_inner_texts()
    assert nav[:2] == ["Overview", "Models"]
    assert page.page.locator("#health-status").inner_text() == "ok"
    page.shot("overview")


def test_pages_are_html_and_listed_in_the_api_description(server):
    response = httpx.get(server.base_url + "/ui/models")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    paths = httpx.get(server.base_url + "/openapi.json").json()["paths"]
    assert paths["/ui/models"]["get"]["responses"]["200"]["content"] == {"text/html": {"schema": {"type": "string"}}}
