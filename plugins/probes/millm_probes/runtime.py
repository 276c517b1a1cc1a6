"""The probes plugin's state in one server process: what is armed, and what it cost.

The armed set is replaced whole on every change (never mutated), so the engine
thread reads a consistent snapshot without a lock. Nothing armed survives an
unload or a restart.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .evaluate import Plan
from .feed import Feed
from .results import ProbeView, now_iso
from .scoring import Bank, CompiledProbe
from .sessions import Sessions
from .store import view_of
from .windows import template_prefix_ids

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
    plan: Plan = field(init=False)  # derived once per armed set, not once per request

    def __post_init__(self) -> None:
        object.__setattr__(self, "plan", Plan.of((a.view, window) for a in self.armed for window in a.view.windows))

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
        self.last_results: dict[str, dict[str, Any]] = {}  # probe id -> its latest outcome
        self._prefix: dict[str, list[int] | None] = {}
        self._views: dict[tuple[str, int], ProbeView] = {}
        self.encoders: dict[str, Any] = {}  # SAE encoders of the resident model (engine thread)
        self.sessions = Sessions(host.db)  # turns of sessions (sessions.py)
        self.feed = Feed(host.settings["PROBE_FEED_QUEUE"])  # the probe:results socket (feed.py)
        self.retention: Any = None  # the background pass, from startup to shutdown (retention.py)

    @property
    def settings(self) -> Any:
        return self.host.settings

    # --- the armed set ---------------------------------------------------------------
    def _publish(self, armed: tuple[Armed, ...]) -> None:
        self.snapshot = Snapshot(armed, Bank([a.compiled for a in armed]) if armed else None)

    def arm(self, entry: Armed) -> None:
        others = tuple(a for a in self.snapshot.armed if a.view.probe_id != entry.view.probe_id)
        self._publish((*others, entry))
        self.last_results.pop(entry.view.probe_id, None)

    def disarm(self, probe_id: str) -> bool:
        armed = self.snapshot.armed
        if probe_id not in self.snapshot.ids():
            return False
        self._publish(tuple(a for a in armed if a.view.probe_id != probe_id))
        return True

    def disarm_all(self) -> list[str]:
        ids = self.snapshot.ids()
        self.snapshot = Snapshot()
        return ids

    def armed_entry(self, probe_id: str) -> Armed | None:
        return next((a for a in self.snapshot.armed if a.view.probe_id == probe_id), None)

    def update_view(self, view: ProbeView) -> None:
        """A moved bar reaches an armed probe at once; its head, and so the bank, is untouched."""
        entry = self.armed_entry(view.probe_id)
        if entry is not None:
            armed = tuple(replace(a, view=view) if a is entry else a for a in self.snapshot.armed)
            self.snapshot = replace(self.snapshot, armed=armed)

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
        """A probe's view, parsed once per bar revision."""
        key = (row.id, row.decision_revision)
        if key not in self._views:
            self._views[key] = view_of(row)
        return self._views[key]

    def prefix_ids(self, engine: Any) -> list[int] | None:
        """The template prefix of the resident model (engine thread; measured once per load)."""
        load_id = engine.info.load_id
        if load_id not in self._prefix:
            self._prefix[load_id] = template_prefix_ids(engine)
        return self._prefix[load_id]

    # --- what the status route reports ------------------------------------------------
    def record(self, results: list[dict[str, Any]], overhead: dict[str, Any]) -> None:
        for result in results:
            if result.get("kind") != "probe":  # another plugin's result (hook monitor_results)
                continue
            self.last_results[result["probe_id"]] = {
                "outcome": result["outcome"],
                "reason": result["reason"],
                "window": result["window"],
                "recorded_at": result["recorded_at"],
            }
        self.last_request = overhead

    def status(self) -> dict[str, Any]:
        armed = []
        for entry in self.snapshot.armed:
            view = entry.view
            last = self.last_results.get(view.probe_id)
            quiet_reason = None
            if last is None:
                quiet_reason = "no_requests_since_armed"
            elif last["outcome"] != "completed":
                quiet_reason = last["reason"]
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
                    "last_result": last,
                }
            )
        return {
            "object": "probe.status",
            "armed": armed,
            "max_armed": self.settings["PROBE_MAX_ARMED"],
            "last_request": self.last_request,
            "overhead_warning_ms": self.settings["PROBE_OVERHEAD_WARN_MS"],
            "checked_at": now_iso(),
        }
