"""``GET /metrics``: the Prometheus text format (behind the admin key when ``MILLM_ADMIN_API_KEYS`` is set)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import falcon

from ..observability.metrics import CONTENT_TYPE
from ..openapi import operation

if TYPE_CHECKING:
    from ..observability.metrics import Metrics
    from ..registry import ModelRegistry
    from ..settings import Settings


class MetricsHost(Protocol):
    """What ``/metrics`` reads of the host."""

    settings: Settings
    registry: ModelRegistry
    metrics: Metrics


class MetricsResource:
    def __init__(self, host: MetricsHost) -> None:
        self.host = host

    @operation("Prometheus metrics (text exposition format)", media_type="text/plain", errors=(404,))
    async def on_get(self, req, resp) -> None:
        if not self.host.settings["MILLM_METRICS"]:
            raise falcon.HTTPNotFound(description="metrics are off (MILLM_METRICS=false)")
        engine = self.host.registry.engine
        if engine is not None:
            self.host.metrics.engine_seen(engine)
        resp.content_type = CONTENT_TYPE
        resp.data = self.host.metrics.exposition()
