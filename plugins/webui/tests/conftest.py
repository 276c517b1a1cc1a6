"""Fixtures for the web UI's tests: a real ``millm serve`` with the UI, and Debian's Chromium driven by Playwright.

Every page a test opens fails the test on a console error, an uncaught page error or a failed
request (a network failure, or an HTTP error the test did not say it expects). Screenshots of
each page land in ``build/ui-screenshots`` (git-ignored), or ``MILLM_UI_SCREENSHOTS``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

UI_MODULES = "webui=millm_webui.plugin"
REPO = Path(__file__).resolve().parents[3]
SCREENSHOTS = Path(os.environ.get("MILLM_UI_SCREENSHOTS", REPO / "build" / "ui-screenshots"))


def chromium_path() -> str | None:
    """Debian's chromium (``.ci/run`` installs it); Playwright never downloads a browser here."""
    for candidate in (os.environ.get("MILLM_UI_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one module. Playwright's sync API runs an event loop on this thread while it is
    open, so any later ``asyncio.run`` here fails: the loop must end with the module, not hold the
    rest of the session (where another test file runs after this one on the same process)."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("Chromium is not installed (apt-get install chromium; .ci/run does it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (requirements.txt)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


class Watched:
    """A Playwright page whose console errors and failed requests are collected, to fail the test."""

    def __init__(self, page: Any, base_url: str, name: str) -> None:
        self.page, self.base_url, self.name = page, base_url, name
        self.problems: list[str] = []
        self.unexpected: list[Any] = []  # responses with an HTTP error the test did not expect
        self.expected_statuses: set[int] = set()
        self.shots = 0
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        page.on("requestfailed", self._failed)
        page.on("response", self._response)
        page.on("dialog", self._dialog)

    def _console(self, message: Any) -> None:
        if message.type == "error":
            text = message.text
            # Chromium logs every HTTP error a fetch gets; one the test expects is not a problem.
            if any(f"status of {s}" in text for s in self.expected_statuses):
                return
            self.problems.append(f"console error: {text}")

    def _dialog(self, dialog: Any) -> None:
        # The UI never calls alert/confirm/prompt: one that opens is injected markup running.
        self.problems.append(f"a {dialog.type} dialog opened: {dialog.message}")
        dialog.dismiss()

    def _failed(self, request: Any) -> None:
        self.problems.append(f"request failed: {request.method} {request.url} ({request.failure})")

    def _response(self, response: Any) -> None:
        if response.status >= 400 and response.status not in self.expected_statuses:
            self.unexpected.append(response)  # its body is read in check(): not from an event handler

    def goto(self, path: str) -> Any:
        response = self.page.goto(self.base_url + path)
        self.page.wait_for_load_state("domcontentloaded")
        return response

    def settled(self, locator: Any, **kwargs: Any) -> Any:
        """Wait for ``locator`` (content of the page an action reloaded), then for that page's deferred
        scripts: an element can be parsed before ui.js has run, and a click on it would do nothing."""
        locator.wait_for(**kwargs)
        self.page.wait_for_load_state("load")
        return locator

    def shot(self, label: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        self.shots += 1
        path = SCREENSHOTS / f"{self.name}-{self.shots:02d}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def check(self) -> None:
        problems = [self._http_error(response) for response in self.unexpected] + self.problems
        assert not problems, "\n".join(problems)

    @staticmethod
    def _http_error(response: Any) -> str:
        try:  # the server's error body says which check refused
            body = response.text()[:1000]
        except Exception as exc:  # the page went away before the body was read
            body = f"(body not read: {exc})"
        return f"HTTP {response.status}: {response.request.method} {response.url}: {body}"


@pytest.fixture
def ui_page(browser, request) -> Iterator[Any]:
    """``ui_page(server)`` → a ``Watched`` page on that server; checked for problems when the test ends."""
    opened: list[Watched] = []
    contexts: list[Any] = []

    def open_page(server: Any) -> Watched:
        context = browser.new_context()
        contexts.append(context)
        watched = Watched(context.new_page(), server.base_url, request.node.name)
        opened.append(watched)
        return watched

    yield open_page
    try:
        for watched in opened:
            watched.shot("end")  # the last state, a failure's included
            watched.check()
    finally:
        for context in contexts:
            context.close()


@pytest.fixture(scope="session")
def ui_model_dir() -> Path:
    """A random 4-layer Llama (SmolLM2's tokenizer and template), as the probes plugin's tests use."""
    from millm_host.testing.tiny_models import tiny_llama

    return tiny_llama("probe-llama", num_hidden_layers=4, max_position_embeddings=4096, seed=7)


@pytest.fixture(scope="session")
def ui_env():
    """``ui_env(**extra)``: a server's environment with the UI plugin (installed or not)."""

    def env(**extra: str) -> dict[str, str]:
        return {"MILLM_PLUGIN_MODULES": UI_MODULES, **extra}

    return env


def probe_lab(model_dir: Path) -> Any:
    """The probes plugin's own test reference (``Lab`` in its tests' conftest) on ``model_dir``: probe
    documents whose test vectors come from transformers and the FORMATS.md math, never from the plugin."""
    import importlib.util

    path = REPO / "plugins" / "probes" / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("millm_probes_test_lab", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Lab(model_dir)
