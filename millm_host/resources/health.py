"""``GET /api/health``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..app import Host


class Health:
    def __init__(self, host: Host) -> None:
        self.host = host

    async def on_get(self, req, resp) -> None:
        registry = self.host.registry
        report = self.host.report
        start = registry.start_model
        if registry.resident is not None:
            status = "ok"
        elif registry._transition is not None:
            status = "loading" if registry._transition[0] == "load" else "unloading"
        elif start is not None and start.state.value == "FAILED":
            status = "failed"
        else:
            status = "no_model"
        resp.media = {
            "status": status,
            "model": registry.resident.id if registry.resident else None,
            "engine": registry.resident.spec.name if registry.resident else None,
            "engine_status": dict(registry.engine.status()) if registry.engine is not None else None,
            "engines": [spec.name for spec in self.host.engines],
            "plugins": [{"name": r.name, "version": r.version} for r in report.loaded],
            "failed_plugins": [{"name": r.name, "error": r.error} for r in report.failed],
            "queue": {"admitted": self.host.scheduler.admitted, "max_waiting": self.host.scheduler.queue_max},
        }
