"""``GET /api/health``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..openapi import operation
from ..protocol_responses import Health as HealthBody

if TYPE_CHECKING:
    from ..app import Host


class Health:
    def __init__(self, host: Host) -> None:
        self.host = host

    @operation("The server's state: the model, its load, the queue, the plugins", response=HealthBody)
    async def on_get(self, req, resp) -> None:
        registry = self.host.registry
        scheduler = self.host.scheduler
        report = self.host.report
        start = registry.start_model
        entry, progress, error = registry.resident, None, None
        if registry.resident is not None:
            status = "ok"
        elif registry._transition is not None:
            kind, entry = registry._transition[0], registry._transition[1]
            status = "loading" if kind == "load" else "unloading"
            progress = entry.progress
        elif start is not None and start.state.value == "FAILED":
            status, entry, error = "failed", start, start.error
        else:
            status = "no_model"
        resp.media = {
            "status": status,
            # The model the status is about: the resident one, the one loading, or the start model that failed.
            "model": entry.id if entry else None,
            "engine": entry.spec.name if entry else None,
            "phase": {"ok": "loaded"}.get(status, status) if entry else None,
            "progress": progress,
            "error": error,
            "engine_status": dict(registry.engine.status()) if registry.engine is not None else None,
            "engines": [spec.name for spec in self.host.engines],
            "plugins": [{"name": r.name, "version": r.version} for r in report.loaded],
            "failed_plugins": [{"name": r.name, "error": r.error} for r in report.failed],
            "queue": {
                "admitted": scheduler.admitted,
                "max_waiting": scheduler.queue_max,
                "generating": scheduler.generating,
                "stalled": scheduler.stalled(),
                "shutting_down": scheduler.closing,
            },
        }
