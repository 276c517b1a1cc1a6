"""Every page, in nav order. A page is one module here (its ``PAGE``) and one template; add yours to the list."""

from __future__ import annotations

from ..render import Page
from . import circuits, clusters, events, home, models, playground, probes, rulesets, sessions, settings, steering

PAGES: list[Page] = [
    playground.PAGE,
    home.PAGE,
    models.PAGE,
    probes.PAGE,
    events.PAGE,
    sessions.LIST,
    sessions.ONE,
    steering.PAGE,
    clusters.PAGE,
    circuits.PAGE,
    rulesets.PAGE,
    settings.PAGE,
]
