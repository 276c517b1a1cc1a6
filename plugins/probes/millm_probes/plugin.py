"""Hook implementations of the probes plugin.

One ``Runtime`` per host, made at ``startup`` and kept in ``host.state["probes"]``;
every hook reaches it through ``host`` or ``ctx.host``, so two hosts in one
process never share armed probes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from millm_host.api import hookimpl

from . import capacity_store, live, routes, set_routes, store
from .runtime import Runtime
from .sets import members_of
from .settings import SETTINGS

log = logging.getLogger("millm.probes")

#: The plugin's key in ``host.state``.
STATE_KEY = "probes"


def _runtime(host: Any) -> Runtime | None:
    """This host's runtime (None before ``startup`` and after ``shutdown``)."""
    return host.state.get(STATE_KEY)


def _start(host: Any) -> Runtime:
    return host.state.setdefault(STATE_KEY, Runtime(host))


@hookimpl
def register_settings(register) -> None:
    """PROBE_MAX_ARMED, PROBE_VERDICT_HEADER_MAX_BYTES, PROBE_SCORE_MAX_INPUTS, PROBE_SAE_DIR, PROBE_OVERHEAD_WARN_MS."""
    for setting in SETTINGS:
        register(setting)


@hookimpl
def register_migrations(register) -> None:
    """The probe tables, in their own version table (``alembic_version_probes``)."""
    register("probes", str(Path(__file__).parent / "migrations" / "versions"))
    register("probe_capacity", capacity_store.MIGRATIONS)  # its own history: no merge with the probe tables


@hookimpl
def register_routes(host, add_route) -> None:
    """The management API under ``/api/probes``."""
    runtime = _start(host)
    routes.install(runtime, add_route)
    set_routes.install(runtime, add_route)  # behaviour sets and each model's Probe capacity


@hookimpl
def startup(host) -> None:
    """Nothing is armed after a restart: mark what the last process left armed as disarmed."""
    runtime = _start(host)
    store.set_disarmed(host.db, "restart")
    runtime.set_members(members_of(store.list_probes(host.db)))


@hookimpl
def shutdown(host) -> None:
    """Forget this host's runtime."""
    host.state.pop(STATE_KEY, None)


@hookimpl
def model_unloading(host, engine) -> None:
    """Every probe is disarmed by an unload: its head was checked against this load only."""
    runtime = _runtime(host)
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
    runtime = _runtime(ctx.host)
    return live.begin(runtime, ctx) if runtime is not None else None


@hookimpl
def after_generate(ctx) -> None:
    """Score every armed probe and window once, and store the results."""
    runtime = _runtime(ctx.host)
    if runtime is not None:
        live.finish(runtime, ctx)


@hookimpl
def render_headers(ctx):
    """``X-miLLM-Probe-Verdicts`` on a monitored non-streaming response."""
    runtime = _runtime(ctx.host)
    return live.headers(runtime, ctx) if runtime is not None else None


@hookimpl
def response_extras(ctx):
    """``millm_probe_verdicts`` in the body, or on a stream's finish chunk."""
    return live.extras(ctx)
