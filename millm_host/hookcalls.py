"""How the host calls hooks: one named policy per kind of hook, and nowhere else.

Every hookspec says in its docstring which policy applies (``Policy: <name>``);
``POLICIES`` maps each hook to its policy and a meta-test keeps the two in step.
Plugins are called in pluggy's order (last registered first; ``tryfirst`` and
``trylast`` respected) under every policy.

``startup``
    ``register_*``, ``startup``. Each plugin in turn. An installed plugin that
    raises is logged, reported as failed (``millm plugins``, ``/api/health``'s
    ``failed_plugins``) and unregistered: the server starts without it and none
    of its hooks runs again. A built-in (``millm_host.*``) that raises stops the
    start: the host itself is broken.
``lifecycle``
    ``model_loaded``, ``model_unloading``, ``shutdown``. Each plugin in turn; an
    error is logged and the others still run: a load, an unload or a shutdown
    never stops halfway because of one plugin.
``request``
    ``validate_request``, ``before_tokenize``, ``after_tokenize``,
    ``before_forward``, ``before_scoring``, ``filter_listed_models``. A plain
    call: the first error propagates and is the request's error (a
    ``MillmError`` as itself, anything else as ``500 internal_error``).
``after_generate``
    Each plugin in turn, whatever another raised. A ``MillmError`` fails a
    request that had not failed yet (the first one wins); any other exception
    is logged.
``rendering``
    ``render_headers``, ``response_extras``. Each plugin in turn. A plugin that
    raises never turns a generated response into an error: the error is logged,
    that plugin's contribution is left out, and the plugin is named in
    ``ctx.plugin_errors``, which the response reports: the
    ``X-miLLM-Plugin-Errors`` header (an RFC 8941 list of strings) on a
    non-streamed response, and on a stream the header for what failed before it
    opened plus ``"millm_plugin_errors": [...]`` on the stream's last finish chunk
    when any rendering failed.
``monitor``
    ``monitor_results``, ``revise_monitor_results``. Each plugin in turn; one that raises is logged and its
    results left out: a companion never costs the probes their own results.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .context import RequestView

if TYPE_CHECKING:
    import pluggy

    from .context import RequestContext

log = logging.getLogger("millm.plugins")

STARTUP = "startup"
LIFECYCLE = "lifecycle"
REQUEST = "request"
AFTER_GENERATE = "after_generate"
RENDERING = "rendering"
MONITOR = "monitor"

#: The policy of every hook.
POLICIES: dict[str, str] = {
    "register_settings": STARTUP,
    "register_engines": STARTUP,
    "register_request_fields": STARTUP,
    "register_request_schemas": STARTUP,
    "register_migrations": STARTUP,
    "register_routes": STARTUP,
    "register_batch_endpoints": STARTUP,
    "startup": STARTUP,
    "shutdown": LIFECYCLE,
    "model_loaded": LIFECYCLE,
    "model_unloading": LIFECYCLE,
    "filter_listed_models": REQUEST,
    "validate_request": REQUEST,
    "before_tokenize": REQUEST,
    "after_tokenize": REQUEST,
    "before_forward": REQUEST,
    "before_scoring": REQUEST,
    "after_generate": AFTER_GENERATE,
    "render_headers": RENDERING,
    "response_extras": RENDERING,
    "monitor_results": MONITOR,
    "revise_monitor_results": MONITOR,
}

#: The response header naming the plugins whose rendering failed (policy ``rendering``).
PLUGIN_ERRORS_HEADER = "X-miLLM-Plugin-Errors"
#: The field of a stream's last finish chunk naming them.
PLUGIN_ERRORS_FIELD = "millm_plugin_errors"

BUILTIN_PREFIX = "millm_host."


def _impls(pm: pluggy.PluginManager, name: str, policy: str) -> list[Any]:
    """The implementations of hook ``name`` in the order pluggy calls them."""
    assert POLICIES[name] == policy, f"{name} is a {POLICIES[name]} hook, not {policy}"
    return list(reversed(getattr(pm.hook, name).get_hookimpls()))


def _call(impl: Any, kwargs: dict[str, Any]) -> Any:
    """One implementation, given the arguments it names (as pluggy passes them)."""
    return impl.function(*(kwargs[arg] for arg in impl.argnames))


def startup(pm: pluggy.PluginManager, name: str, **kwargs: Any) -> None:
    """Policy ``startup``: a failing installed plugin is reported and unregistered; a built-in's failure is fatal."""
    for impl in _impls(pm, name, STARTUP):
        try:
            _call(impl, kwargs)
        except Exception as exc:
            if impl.plugin_name.startswith(BUILTIN_PREFIX):
                raise
            log.error("plugin %s failed in %s: %s", impl.plugin_name, name, exc)
            pm.millm_report.fail(impl.plugin_name, exc)  # type: ignore[attr-defined]
            plugin = pm.get_plugin(impl.plugin_name)
            if plugin is not None:
                pm.unregister(plugin)


def lifecycle(pm: pluggy.PluginManager, name: str, **kwargs: Any) -> None:
    """Policy ``lifecycle``: every plugin runs; an error is logged."""
    for impl in _impls(pm, name, LIFECYCLE):
        try:
            _call(impl, kwargs)
        except Exception:
            log.exception("plugin %s failed in %s", impl.plugin_name, name)


#: The request hooks that run before generation: their ``ctx`` is a ``RequestView`` (read only).
BEFORE_GENERATION = frozenset(
    {"validate_request", "before_tokenize", "after_tokenize", "before_forward", "before_scoring"}
)


def request(pm: pluggy.PluginManager, name: str, **kwargs: Any) -> list[Any]:
    """Policy ``request``: a plain call; the first error propagates. Returns the non-None results.

    A hook that runs before generation gets the request as a ``RequestView``.
    """
    assert POLICIES[name] == REQUEST, f"{name} is a {POLICIES[name]} hook, not {REQUEST}"
    if name in BEFORE_GENERATION:
        kwargs["ctx"] = RequestView(kwargs["ctx"])
    return getattr(pm.hook, name)(**kwargs)


def after_generate(pm: pluggy.PluginManager, ctx: RequestContext) -> None:
    """Policy ``after_generate``: every plugin runs; the first ``MillmError`` fails a request not yet failed."""
    from .errors import MillmError

    for impl in _impls(pm, "after_generate", AFTER_GENERATE):
        try:
            _call(impl, {"ctx": ctx})
        except MillmError as exc:  # a plugin refuses the finished output
            ctx.error = ctx.error or exc
        except Exception:
            log.exception("plugin %s failed in after_generate", impl.plugin_name)


def rendering(pm: pluggy.PluginManager, name: str, ctx: RequestContext) -> list[Any]:
    """Policy ``rendering``: each plugin's non-None result; a failing plugin's is left out and named
    in ``ctx.plugin_errors``."""
    results = []
    for impl in _impls(pm, name, RENDERING):
        try:
            result = _call(impl, {"ctx": ctx})
        except Exception:
            log.exception("plugin %s failed in %s; its contribution is left out", impl.plugin_name, name)
            if impl.plugin_name not in ctx.plugin_errors:
                ctx.plugin_errors.append(impl.plugin_name)
            continue
        if result is not None:
            results.append(result)
    return results


def monitor(pm: pluggy.PluginManager, ctx: RequestContext | None, monitored: Any) -> list[Any]:
    """Policy ``monitor``: each plugin's results, flattened; a plugin that raises is logged and left out."""
    results: list[Any] = []
    for impl in _impls(pm, "monitor_results", MONITOR):
        try:
            found = _call(impl, {"ctx": ctx, "monitored": monitored})
        except Exception:
            log.exception("plugin %s failed in monitor_results; its results are left out", impl.plugin_name)
            continue
        results.extend(found or ())
    return results


def revise(pm: pluggy.PluginManager, host: Any, results: list[dict[str, Any]]) -> int:
    """Policy ``monitor`` for ``revise_monitor_results``: how many stored results were replaced in all."""
    replaced = 0
    for impl in _impls(pm, "revise_monitor_results", MONITOR):
        try:
            replaced += _call(impl, {"host": host, "results": results}) or 0
        except Exception:
            log.exception("plugin %s failed in revise_monitor_results", impl.plugin_name)
    return replaced
