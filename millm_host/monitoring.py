"""What a monitoring plugin (probes) hands the plugins that report results beside its own.

The probes plugin builds one ``MonitoredRequest`` per monitored request and calls
``monitor_results`` (hook ``monitor_results``, policy ``monitor``); what the other
plugins return is listed, stored and rendered with the probe results on every
surface. Plugins never import each other: this is the whole contract.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import RequestContext


@dataclass(frozen=True)
class WindowText:
    """One window's text, or why it has none (the reason the probes report for that window)."""

    text: str | None
    outcome: str | None = None  # skipped, failed or interrupted when ``text`` is None
    reason: str | None = None
    status: str = "final"  # unavailable: an interrupted request


@dataclass
class MonitoredRequest:
    """A monitored request as the probes see it: who is armed, on which windows, and their texts."""

    behaviours: Mapping[str, tuple[str, ...]]  # each armed behaviour key -> the windows its probes report
    request_id: str | None
    trace_id: str
    span_id: str
    skip: str | None  # why no window is scored (judge_traffic, engine_unsupported, …); None: scored
    interrupted: str | None
    read_window: Callable[[str], WindowText]  # decodes a window's text (engine thread; cached here)
    host: Any = None  # the Host serving it (a stateless request has no ``ctx``)
    #: True on a stateless route (``POST /api/probes/score``, one call per input): no live budget, so a
    #: plugin may wait for what it decides (operator code); nothing is stored (``persistence: not_persisted``).
    stateless: bool = False
    #: Per-plugin scratch shared by every call of one request (a stateless request's inputs); keep your own key.
    state: dict[str, Any] = field(default_factory=dict)
    #: Each behaviour key -> the ``set`` block its probe results carry (None for none): a result another
    #: plugin lists beside a behaviour's probes carries the same block.
    sets: Mapping[str, dict[str, Any] | None] = field(default_factory=dict)
    _texts: dict[str, WindowText] = field(default_factory=dict)

    def window(self, name: str) -> WindowText:
        """The text of ``name`` (``all``, ``prompt``, ``response``, ``last_user``, ``reasoning``, ``answer``),
        decoded once."""
        if name not in self._texts:
            self._texts[name] = self.read_window(name)
        return self._texts[name]


def monitor_results(ctx: RequestContext, monitored: MonitoredRequest) -> list[dict[str, Any]]:
    """Every plugin's results for ``monitored`` (hook ``monitor_results``), in one flat list."""
    from . import hookcalls
    from .host_view import host_of

    assert ctx.host is not None, "a monitored request runs on a host"
    return hookcalls.monitor(host_of(ctx.host).pm, ctx, monitored)


def stateless_monitor_results(host: Any, monitored: MonitoredRequest) -> list[dict[str, Any]]:
    """``monitor_results`` on a stateless route (``monitored.stateless``): the hook is called with ``ctx=None``.

    Blocking (a plugin may wait for operator code): call it off the event loop."""
    from . import hookcalls
    from .host_view import host_of

    assert monitored.stateless, "a live request goes through monitor_results(ctx, monitored)"
    return hookcalls.monitor(host_of(host).pm, None, monitored)


def revise_monitor_results(host: Any, results: list[dict[str, Any]]) -> int:
    """Replace stored results in place, by ``result_id`` (hook ``revise_monitor_results``); how many were."""
    from . import hookcalls
    from .host_view import host_of

    return hookcalls.revise(host_of(host).pm, host, results)
