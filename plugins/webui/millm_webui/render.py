"""Pages: a Jinja template (autoescaped: every name from the server is text, never markup) filled
by a loader that reads the public API, and the Falcon resource that serves it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import falcon
from jinja2 import Environment, PackageLoader, select_autoescape

from millm_host.api import operation

from . import verdicts
from .api_client import Api, NeedsKey

Loader = Callable[..., Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Page:
    """One page: ``path`` (a Falcon URI template under ``/ui``), its nav ``title`` (``None``: not in the
    nav), its ``template``, and ``load(api, req, **params)`` → the template's variables."""

    path: str
    title: str | None
    template: str
    load: Loader
    summary: str = ""


ENV = Environment(
    loader=PackageLoader("millm_webui", "templates"),
    autoescape=select_autoescape(["html"], default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


ENV.globals.update(decided=verdicts.decided, verdict_word=verdicts.verdict_word)


def render(template: str, **context: Any) -> str:
    return ENV.get_template(template).render(**context)


class PageResource:
    """``GET`` one page: its loader's data through the API, rendered; the key form if the API wants a key."""

    def __init__(self, host: Any, page: Page, nav: list[Page]) -> None:
        self.host = host
        self.page = page
        self.nav = nav

    @operation("An operator's page (HTML), built on this API's own answers", media_type="text/html")
    async def on_get(self, req, resp, **params: str) -> None:
        api = Api(self.host.app, req)
        base = {"nav": self.nav, "page": self.page, "path": req.path}
        try:
            data = await self.page.load(api, req, **params)
            body = render(self.page.template, **base, **data)
        except NeedsKey as refused:
            resp.status = falcon.HTTP_401
            body = render("key.html", **base, message=refused.message)
        resp.content_type = "text/html; charset=utf-8"
        resp.text = body
        resp.set_header("Cache-Control", "no-store")


STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}
#: Every script and style sheet in ``static/`` (a page's own script is ``static/<page>.js``).
STATIC_FILES = sorted(
    f.name for f in resources.files("millm_webui").joinpath("static").iterdir() if f.name.endswith(tuple(STATIC_TYPES))
)


class Static:
    """``/ui/static/<name>``: the script layer and the style sheets (no build step)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.body = resources.files("millm_webui").joinpath("static", name).read_bytes()
        self.content_type = STATIC_TYPES[name[name.rindex(".") :]]

    async def on_get(self, req, resp) -> None:
        resp.content_type = f"{self.content_type}; charset=utf-8"
        resp.data = self.body


class Script(Static):
    @operation("A script of the web UI", media_type="text/javascript")
    async def on_get(self, req, resp) -> None:
        await super().on_get(req, resp)


class StyleSheet(Static):
    @operation("A style sheet of the web UI", media_type="text/css")
    async def on_get(self, req, resp) -> None:
        await super().on_get(req, resp)


def static_resource(name: str) -> Static:
    """The resource serving ``static/<name>``, described with its own media type."""
    return Script(name) if name.endswith(".js") else StyleSheet(name)


class Root:
    """``/`` sends a browser to the UI."""

    @operation("Redirect to the operator's web UI (/ui)", status=302, media_type="text/html")
    async def on_get(self, req, resp) -> None:
        resp.status = falcon.HTTP_302
        resp.location = "/ui"
        resp.content_type = "text/html; charset=utf-8"
        resp.text = '<!doctype html><title>miLLM</title><a href="/ui">miLLM</a>'  # as documented: HTML
