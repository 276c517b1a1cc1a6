"""Hook implementations of the rulesets plugin.

One ``Runtime`` per host, made at ``startup`` and kept in ``host.state["rulesets"]``.
The plugin talks to the probes plugin only through the ``monitor_results`` hook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from millm_host.api import add_converger, hookimpl

from . import live, routes
from .converge import Converger
from .runtime import Runtime
from .settings import SETTINGS

__version__ = "0.1.0"  # reported by /api/health when loaded through MILLM_PLUGIN_MODULES

STATE_KEY = "rulesets"


def _start(host: Any) -> Runtime:
    return host.state.setdefault(STATE_KEY, Runtime(host))


@hookimpl
def register_settings(register) -> None:
    """RULE_TIME_BUDGET_MS, RULE_SIGNALS_ENABLED."""
    for setting in SETTINGS:
        register(setting)


@hookimpl
def register_migrations(register) -> None:
    """The rule tables, in their own version table (``alembic_version_rulesets``)."""
    register("rulesets", str(Path(__file__).parent / "migrations" / "versions"))


@hookimpl
def register_routes(host, add_route) -> None:
    """``/api/rule-sets`` and ``/api/probes/behaviours/{key}/rule-signals``."""
    routes.install(_start(host), add_route)


@hookimpl
def startup(host) -> None:
    """Re-prove every stored set's cases (one this build disagrees with is marked vectors_failed); then
    follow the stored sets and attachments, which any process may change (converge.py)."""
    runtime = _start(host)
    _rule_results(host.metrics)  # listed by /metrics from the start
    runtime.load()
    add_converger(host, "rulesets", Converger(runtime))


@hookimpl
def shutdown(host) -> None:
    """Stop the rule runner."""
    runtime = host.state.pop(STATE_KEY, None)
    if runtime is not None:
        runtime.close()


@hookimpl
def monitor_results(ctx, monitored):
    """A rule result per attached expression and window, beside the armed (or, stateless, scored) probes."""
    host = ctx.host if ctx is not None else monitored.host
    runtime = host.state.get(STATE_KEY) if host is not None else None
    if runtime is None:
        return None
    results = live.results(runtime, monitored)
    if ctx is not None:  # a live request: counted in /metrics and added to its span
        _record(host.metrics, ctx, results)
    return results


def _rule_results(metrics: Any) -> Any:
    return metrics.counter("millm_rule_results", "Rule results, by signal and outcome", ("signal", "outcome"))


def _record(metrics: Any, ctx: Any, results: list[dict[str, Any]]) -> None:
    """Each result counted by expression and outcome (``fired`` or ``clear`` once decided, else its
    ``reason``) and added to the request's span."""
    counter = _rule_results(metrics)
    for result in results:
        fires = result.get("fires")
        outcome = "fired" if fires is True else "clear" if fires is False else str(result.get("reason") or "")
        counter.inc(signal=str(result.get("name") or ""), outcome=outcome)
    metrics.trace_events(ctx, results, "mi.rule.result/v1")
