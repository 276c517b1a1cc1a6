"""Hook implementations of the web UI plugin: its pages, script and style sheet as routes."""

from __future__ import annotations

from millm_host.api import hookimpl

from .pages import PAGES
from .render import STATIC_FILES, PageResource, Root, static_resource

__version__ = "0.1.0"  # reported by /api/health when loaded through MILLM_PLUGIN_MODULES


@hookimpl
def register_routes(host, add_route) -> None:
    """``/ui`` and its pages, ``/ui/static/*``, and ``/`` (a redirect to ``/ui``)."""
    nav = [page for page in PAGES if page.title]
    for page in PAGES:
        add_route(page.path, PageResource(host, page, nav))
    for name in STATIC_FILES:
        add_route(f"/ui/static/{name}", static_resource(name))
    add_route("/", Root())
