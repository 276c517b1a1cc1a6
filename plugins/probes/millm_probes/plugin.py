"""Hook implementations of the probes plugin.

One ``Runtime`` per host, made at ``startup``; the request-path hooks find it
through the request's settings object (each host has its own), so two hosts in
one process never share armed probes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from millm_host.api import hookimpl

from . import live, routes, store
from .runtime import Runtime
from .settings import SETTINGS
from .stateless import ScoreRequest

log = logging.getLogger("millm.probes")

_runtimes: dict[int, Runtime] = {}  # id(host.settings) -> that host's runtime


def _runtime(settings: Any) -> Runtime | None:
    return _runtimes.get(id(settings))


@hookimpl
def register_settings(register) -> None:
    """PROBE_MAX_ARMED, PROBE_VERDICT_HEADER_MAX_BYTES, PROBE_SCORE_MAX_INPUTS, PROBE_SAE_DIR, PROBE_OVERHEAD_WARN_MS."""
    for setting in SETTINGS:
        register(setting)


@hookimpl
def register_migrations(register) -> None:
    """The probe tables, in their own version table (``alembic_version_probes``)."""
    register("probes", str(Path(__file__).parent / "migrations" / "versions"))


@hookimpl
def register_routes(host, add_route) -> None:
    """The management API under ``/api/probes``."""
    runtime = _runtimes.setdefault(id(host.settings), Runtime(host))
    routes.install(runtime, add_route)
    host.openapi_bodies.append(("/api/probes/score", ScoreRequest))


@hookimpl
def startup(host) -> None:
    """Nothing is armed after a restart: mark what the last process left armed as disarmed."""
    _runtimes.setdefault(id(host.settings), Runtime(host))
    store.set_disarmed(host.db, "restart")


@hookimpl
def shutdown(host) -> None:
    """Forget this host's runtime."""
    _runtimes.pop(id(host.settings), None)


@hookimpl
def model_unloading(host, engine) -> None:
    """Every probe is disarmed by an unload: its head was checked against this load only."""
    runtime = _runtime(host.settings)
    if runtime is None:
        return
    runtime.forget_model(engine.info.load_id)
    disarmed = runtime.disarm_all()
    if disarmed:
        log.info("model unloading: disarmed %s", ", ".join(disarmed))
        store.set_disarmed(host.db, "model_unloaded")


@hookimpl
def before_forward(ctx):
    """Read hooks on the armed probes' layers (none when nothing is armed)."""
    runtime = _runtime(ctx.settings)
    return live.begin(runtime, ctx) if runtime is not None else None


@hookimpl
def after_generate(ctx) -> None:
    """Score every armed probe and window once, and store the results."""
    runtime = _runtime(ctx.settings)
    if runtime is not None:
        live.finish(runtime, ctx)


@hookimpl
def render_headers(ctx):
    """``X-miLLM-Probe-Verdicts`` on a monitored non-streaming response."""
    runtime = _runtime(ctx.settings)
    return live.headers(runtime, ctx) if runtime is not None else None


@hookimpl
def response_extras(ctx):
    """``millm_probe_verdicts`` in the body, or a terminal chunk on a stream."""
    return live.extras(ctx)
