"""Hook implementations of the probes plugin.

One ``Runtime`` per host, made at ``startup`` and kept in ``host.state["probes"]``;
every hook reaches it through ``host`` or ``ctx.host``, so two hosts in one
process never share armed probes.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from millm_host.api import add_converger, hookimpl, replica_alone

from . import metrics, routes, store
from .arming import routes as behaviour_routes
from .arming.converge import Converger
from .arming.sets import members_of
from .capacity import routes as capacity_routes
from .capacity.store import MIGRATIONS as CAPACITY_MIGRATIONS
from .feed.tail import Tail
from .hub import routes as hub_routes
from .runtime import Runtime
from .serving import batch_lines, live
from .sessions import turns
from .sessions.retention import Retention
from .sessions.settings import SESSION_SETTINGS
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
    """PROBE_MAX_ARMED, PROBE_VERDICT_HEADER_MAX_BYTES, PROBE_SCORE_MAX_INPUTS, PROBE_SAE_DIR, the budget, the Hub."""
    for setting in SETTINGS:
        register(setting)
    for setting in SESSION_SETTINGS:  # PROBE_SESSION_IDLE_MINUTES, PROBE_TRANSCRIPTS, retention, the feed
        register(setting)


@hookimpl
def register_migrations(register) -> None:
    """The probe tables, in their own version table (``alembic_version_probes``)."""
    register("probes", str(Path(__file__).parent / "migrations" / "versions"))
    register("probe_capacity", CAPACITY_MIGRATIONS)  # its own history: no merge with the probe tables


@hookimpl
def register_routes(host, add_route) -> None:
    """The management API under ``/api/probes``."""
    runtime = _start(host)
    routes.install(runtime, add_route)
    behaviour_routes.install(runtime, add_route)  # behaviour sets
    capacity_routes.install(runtime, add_route)  # each model's Probe capacity
    hub_routes.install(runtime, add_route)  # Browse Hub


@hookimpl
def register_batch_endpoints(host, register) -> None:
    """``/api/probes/score`` lines in the Batch API."""
    register(batch_lines.URL, batch_lines.ScoreLines(_start(host)))


@hookimpl
def startup(host) -> None:
    """Nothing is armed after a restart of the only replica: mark what the last process left armed as
    disarmed. A replica joining others keeps the armed state, and converges to it (arming/converge.py)."""
    runtime = _start(host)
    metrics.declare(host.metrics)
    if replica_alone(host):
        store.set_disarmed(host.db, "restart")
    add_converger(host, "probes", Converger(runtime))
    runtime.set_members(members_of(store.probe_states(host.db)))
    runtime.retention = Retention(host.db, host.settings)
    runtime.retention.start()
    runtime.tail = Tail(host.db, host.settings["PROBE_TAIL_INTERVAL_MS"] / 1000, runtime.relay)
    runtime.tail.start()


@hookimpl
def shutdown(host) -> None:
    """Stop the retention pass and the tail; forget this host's runtime."""
    runtime = host.state.pop(STATE_KEY, None)
    if runtime is not None and runtime.retention is not None:
        runtime.retention.stop()
    if runtime is not None and runtime.tail is not None:
        runtime.tail.stop()


@hookimpl
def model_unloading(host, engine) -> None:
    """Every probe is disarmed here by an unload: its head was checked against this load only.

    On the only replica the probes are disarmed in the database too (as a single server
    always did); while other replicas run, they stay armed there, and the next model
    loaded here runs their gates again.
    """
    runtime = _runtime(host)
    if runtime is None:
        return
    runtime.forget_model(engine.info.load_id)
    disarmed = runtime.disarm_all()
    if disarmed:
        log.info("model unloading: disarmed %s", ", ".join(disarmed))
        if replica_alone(host):
            store.set_disarmed(host.db, "model_unloaded")


@hookimpl
def register_request_fields(register) -> None:
    """``probe_token_scores`` on chat and text completions: each live result carries its per-token scores."""
    for endpoint in live.TOKEN_SCORES_ENDPOINTS:
        register(endpoint, (live.TOKEN_SCORES_FIELD,))


@hookimpl
def register_request_schemas(register) -> None:
    """``probe_token_scores``, in the chat and text completion request schemas of ``/openapi.json``."""
    for endpoint in live.TOKEN_SCORES_ENDPOINTS:
        register(endpoint, live.ProbeFields)


@hookimpl
def validate_request(ctx) -> None:
    """Refuse a malformed ``X-miLLM-Session`` or ``probe_token_scores``; while a probe is armed, settle the
    request's session."""
    turns.named_session(ctx.headers)
    if ctx.endpoint in live.TOKEN_SCORES_ENDPOINTS:
        live.wants_token_scores(ctx)
    runtime = _runtime(ctx.host)
    if runtime is None or not runtime.snapshot.armed or ctx.scoring or ctx.endpoint not in turns.MONITORED:
        return
    if turns.judge_call(ctx.headers):  # never user traffic: it joins no session and keeps no text
        ctx.state[turns.UNGROUPED] = True
        return
    live.settle(runtime, ctx)


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
def revise_monitor_results(host, results):
    """Replace another plugin's stored results (decided after the response) in place, by result_id."""
    runtime = _runtime(host)
    return store.revise_events(runtime.host.db, results) if runtime is not None else 0


@hookimpl
def render_headers(ctx):
    """``X-miLLM-Probe-Verdicts`` on a monitored non-streaming response; the session and transcript headers."""
    runtime = _runtime(ctx.host)
    if runtime is None:
        return None
    found = {**(turns.headers(ctx) or {}), **(live.headers(runtime, ctx) or {})}
    return found or None


@hookimpl
def response_extras(ctx):
    """``millm_probe_verdicts`` in the body, or on a stream's finish chunk."""
    return live.extras(ctx)
