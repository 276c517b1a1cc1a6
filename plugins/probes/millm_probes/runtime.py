"""The probes plugin's state in one server process: what is armed, and what it cost.

The armed set is replaced whole on every change (never mutated), so the engine
thread reads a consistent snapshot without a lock. Nothing armed survives an
unload or a restart.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from . import metrics, store
from .arming.sets import Members, blocks_for
from .feed.websocket import Feed
from .results import ProbeView, now_iso
from .scoring.bank import Bank, CompiledProbe
from .scoring.evaluate import Plan
from .scoring.windows import template_prefix_ids
from .sessions.turns import Sessions
from .store import view_of

if TYPE_CHECKING:
    from millm_host.api import Host

    from .tables import Probe


@dataclass(frozen=True)
class Armed:
    """An armed probe: its view, its head compiled for the resident model, the load it was checked on."""

    view: ProbeView
    compiled: CompiledProbe
    load_id: str
    armed_at: str


@dataclass(frozen=True)
class Snapshot:
    """What is armed; a request keeps the one current when it began."""

    armed: tuple[Armed, ...] = ()
    bank: Bank | None = None
    sets: dict[str, dict[str, Any]] = field(default_factory=dict)  # probe id -> its set block
    plan: Plan = field(init=False)  # derived once per armed set, not once per request
    by_id: dict[str, Armed] = field(init=False)  # probe id -> its entry (a set may hold thousands)

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", Plan.of((a.view, window) for a in self.armed for window in a.view.windows))
        object.__setattr__(self, "by_id", {a.view.probe_id: a for a in self.armed})

    def ids(self) -> list[str]:
        return [a.view.probe_id for a in self.armed]


class Runtime:
    """Per-host state of the probes plugin."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.snapshot = Snapshot()
        self.lock = asyncio.Lock()  # arming, disarming, deleting and recalibrating, one at a time
        self.unloaded: set[str] = set()  # load ids whose model has gone: nothing arms on them
        self.last_request: dict[str, Any] | None = None
        self.last_results: dict[str, deque[list[dict[str, Any]]]] = {}  # probe id -> its recent requests' results
        self._prefix: dict[str, list[int] | None] = {}
        self._views: dict[tuple[str, int], ProbeView] = {}
        self.encoders: dict[str, Any] = {}  # SAE encoders of the resident model (engine thread)
        self.sessions = Sessions(host.db)  # turns of sessions (sessions/turns.py)
        self.feed = Feed(host.settings["PROBE_FEED_QUEUE"])  # the probe:results socket (feed/websocket.py)
        self.retention: Any = None  # the background pass, from startup to shutdown (sessions/retention.py)
        self.tail: Any = None  # other processes' results, read from the events table (feed/tail.py)
        self.members: Members = {}  # behaviour sets, as imported (sets.members_of)
        self.measuring: dict[str, Any] = {}  # model id -> its measurement in progress (measure.Stop)

    @property
    def settings(self) -> Any:
        return self.host.settings

    # --- the armed set ---------------------------------------------------------------
    def _publish(self, armed: tuple[Armed, ...], bank: Bank | None | bool = True) -> None:
        """Replace the armed set (``bank``: True to build it, else the one to keep)."""
        if bank is True:
            bank = Bank([a.compiled for a in armed]) if armed else None
        sets = blocks_for((a.view for a in armed), self.members)
        self.snapshot = Snapshot(armed, bank or None, sets)

    def set_members(self, members: Members) -> None:
        """The behaviour sets changed (an import or a delete): results say so from the next request on."""
        self.members = members
        self._publish(self.snapshot.armed, self.snapshot.bank)

    def arm_many(self, entries: list[Armed]) -> None:
        """Arm a behaviour's probes at once: requests see all of them or none."""
        ids = {e.view.probe_id for e in entries}
        self._publish((*(a for a in self.snapshot.armed if a.view.probe_id not in ids), *entries))
        for probe_id in ids:
            self.last_results.pop(probe_id, None)

    def disarm_many(self, probe_ids: set[str]) -> list[str]:
        probe_ids = set(probe_ids)
        gone = [i for i in self.snapshot.ids() if i in probe_ids]
        if gone:
            self._publish(tuple(a for a in self.snapshot.armed if a.view.probe_id not in probe_ids))
        return gone

    def arm(self, entry: Armed) -> None:
        others = tuple(a for a in self.snapshot.armed if a.view.probe_id != entry.view.probe_id)
        self._publish((*others, entry))
        self.last_results.pop(entry.view.probe_id, None)

    def disarm(self, probe_id: str) -> bool:
        armed = self.snapshot.armed
        if probe_id not in self.snapshot.by_id:
            return False
        self._publish(tuple(a for a in armed if a.view.probe_id != probe_id))
        return True

    def disarm_all(self) -> list[str]:
        ids = self.snapshot.ids()
        self.snapshot = Snapshot()
        return ids

    def armed_entry(self, probe_id: str) -> Armed | None:
        return self.snapshot.by_id.get(probe_id)

    def update_view(self, view: ProbeView) -> None:
        """A moved bar reaches an armed probe at once; its head, and so the bank, is untouched."""
        entry = self.armed_entry(view.probe_id)
        if entry is not None:
            armed = tuple(replace(a, view=view) if a is entry else a for a in self.snapshot.armed)
            self._publish(armed, self.snapshot.bank)

    def forget_probe(self, probe_id: str) -> None:
        self.last_results.pop(probe_id, None)
        for key in [k for k in self._views if k[0] == probe_id]:
            del self._views[key]

    def forget_model(self, load_id: str) -> None:
        self.unloaded.add(load_id)
        self._prefix.pop(load_id, None)
        self.encoders.clear()

    # --- caches ----------------------------------------------------------------------
    def view(self, row: Probe) -> ProbeView:
        """A probe's view, parsed once per bar revision (blocking: a row listed without its definition has
        it read)."""
        return self.views([row])[0]

    def views(self, rows: list[Probe]) -> list[ProbeView]:
        """The rows' views, parsing only those not parsed yet; the definitions ``store.list_probes`` left out
        are read in one query (blocking: call off the event loop)."""
        missing = [r for r in rows if (r.id, r.decision_revision) not in self._views]
        unread = [r.id for r in missing if not store.has_definition(r)]
        texts = store.definitions(self.host.db, unread) if unread else {}
        for row in missing:
            self._views[(row.id, row.decision_revision)] = view_of(row, texts.get(row.id))
        return [self._views[(r.id, r.decision_revision)] for r in rows]

    def prefix_ids(self, engine: Any) -> list[int] | None:
        """The template prefix of the resident model (engine thread; measured once per load)."""
        load_id = engine.info.load_id
        if load_id not in self._prefix:
            self._prefix[load_id] = template_prefix_ids(engine)
        return self._prefix[load_id]

    # --- what the status route reports ------------------------------------------------
    def observe(self, ctx: Any, results: list[dict[str, Any]], overhead_s: float) -> None:
        """Verdict counts, the overhead, and the results as events of the request's span (/metrics)."""
        if ctx.host is not None:
            metrics.record(ctx, results, overhead_s)

    def record(self, results: list[dict[str, Any]], overhead: dict[str, Any]) -> None:
        """Keep each probe's latest results, one entry per request over all its windows, and this process's
        last request's overhead."""
        self.keep_recent(results)
        threshold = self.settings["PROBE_OVERHEAD_WARN_MS"]
        self.last_request = {
            **overhead,
            "threshold_ms": threshold,
            "threshold_exceeded": overhead.get("overhead_ms", 0.0) > threshold,
            "recorded_at": now_iso(),
        }

    def relay(self, messages: list[dict[str, Any]]) -> None:
        """Requests another process served (``tail``): to the feed and to each probe's recent results."""
        for message in messages:
            self.keep_recent(message["results"])
            self.feed.publish(
                message["results"],
                request_id=message["request_id"],
                endpoint=None,  # known to the process that served it only
                session=message["session"],
                turn=message["turn"],
            )

    def keep_recent(self, results: list[dict[str, Any]]) -> None:
        """Each probe's latest results, one entry per request over all its windows (status)."""
        by_probe: dict[str, list[dict[str, Any]]] = {}
        for result in results:
            if result.get("kind") != "probe":  # another plugin's result (hook monitor_results)
                continue
            by_probe.setdefault(result["probe_id"], []).append(
                {
                    "outcome": result["outcome"],
                    "reason": result["reason"],
                    "window": result["window"],
                    "recorded_at": result["recorded_at"],
                }
            )
        for probe_id, windows in by_probe.items():
            recent = self.last_results.setdefault(probe_id, deque(maxlen=RECENT_REQUESTS))
            recent.append(windows)

    def status(self) -> dict[str, Any]:
        armed = []
        for entry in self.snapshot.armed:
            view = entry.view
            recent = list(self.last_results.get(view.probe_id, ()))
            quiet_reason, reasons = quiet(recent)
            armed.append(
                {
                    "probe_id": view.probe_id,
                    "name": view.name,
                    "behaviour": view.behaviour,
                    "layer": view.definition.read.layer,
                    "hook_point": view.definition.read.hook_point,
                    "windows": view.windows,
                    "armed_at": entry.armed_at,
                    "model_load_id": entry.load_id,
                    "quiet": quiet_reason is not None,
                    "quiet_reason": quiet_reason,
                    "quiet_reasons": reasons,  # every window of the recent requests, by reason
                    "recent_requests": len(recent),
                    "last_result": recent[-1][-1] if recent else None,
                    "last_results": recent[-1] if recent else [],  # every window of the latest request
                }
            )
        return {
            "object": "probe.status",
            "armed": armed,
            "max_armed": self.settings["PROBE_MAX_ARMED"],
            "force_serial": self.settings["PROBE_FORCE_SERIAL"],
            "last_request": self.last_request,
            "overhead_warning_ms": self.settings["PROBE_OVERHEAD_WARN_MS"],
            "checked_at": now_iso(),
        }


RECENT_REQUESTS = 20  # per probe, what a quiet probe's reason is read over


def quiet(recent: list[list[dict[str, Any]]]) -> tuple[str | None, dict[str, int]]:
    """(why a probe is quiet, its reasons counted), over all windows of its recent requests.

    A probe is quiet when no window of its latest request completed; the reason is the most
    frequent one over every window of the recent requests, so one odd window or request does not hide
    the pattern (``quiet_reasons`` counts them all).
    """
    if not recent:
        return "no_requests_since_armed", {}
    reasons = Counter(r["reason"] for request in recent for r in request if r["outcome"] != "completed")
    if any(r["outcome"] == "completed" for r in recent[-1]):
        return None, dict(reasons)
    latest = Counter(r["reason"] for r in recent[-1])
    # the pattern over every window of the recent requests (one odd request does not hide it); a tie goes
    # to what the latest request says
    top = max(reasons, key=lambda reason: (reasons[reason], latest[reason]))
    return top, dict(reasons)
