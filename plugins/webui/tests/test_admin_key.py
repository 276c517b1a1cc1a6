"""Behind the admin key: a page without the key shows only the key form; with it, the data; the key is
sent as a Bearer on every call the page makes (and its live verdicts are polled: a browser cannot put
a header on a WebSocket)."""

from __future__ import annotations

import httpx
import pytest

ADMIN = "admin-key"


@pytest.fixture(scope="module")
def server(server_factory, ui_model_dir, ui_env):
    return server_factory(ui_model_dir, env=ui_env(MILLM_ADMIN_API_KEYS=ADMIN, MILLM_API_KEYS="user-key"))


def test_pages_need_the_admin_key(server, ui_page):
    page = ui_page(server)
    page.expected_statuses.add(401)
    response = page.goto("/ui/models")
    assert response.status == 401
    assert page.page.locator("#needs-key").is_visible()
    assert "probe-llama" not in page.page.content()  # no data without the key
    page.shot("needs-key")

    page.page.click("#needs-key button")
    page.page.fill("#key-form input[name=key]", "user-key")  # a /v1 key opens no page
    with page.page.expect_navigation():  # the form reloads the page; wait for that one, not the last
        page.page.click("#key-form button[value=save]")
    assert page.page.locator("#needs-key").is_visible()

    page.page.click("#key-button")
    page.page.fill("#key-form input[name=key]", ADMIN)
    page.page.click("#key-form button[value=save]")
    # the page's data, then its scripts: ui.js marks the key button once the document is parsed
    page.settled(page.page.locator("section.model", has_text="probe-llama"))
    assert page.page.locator("#key-button").inner_text() == "Admin key ✓"
    page.shot("with-key")

    page.expected_statuses.clear()  # from here on, every call carries the key
    page.goto("/ui/settings")
    row = page.page.locator('tr[data-setting="MILLM_ADMIN_API_KEYS"]')
    assert row.locator(".value").inner_text().startswith("set")
    assert ADMIN not in page.page.locator("main").inner_text()
    page.goto("/ui/probes")
    page.page.wait_for_selector("#feed-state[data-state=live]")
    assert page.page.locator("#feed-state").inner_text() == "live (polling)"


def test_the_ui_html_is_not_data(server):
    """The pages are open to fetch (they hold no data); the API they read is not."""
    assert httpx.get(server.base_url + "/ui/models").status_code == 401
    assert httpx.get(server.base_url + "/api/models").status_code == 401
    assert httpx.get(server.base_url + "/ui/static/ui.js").status_code == 200
