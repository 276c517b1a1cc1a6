"""Routes of each model's Probe capacity: read it, measure the model (or cancel that), set its limits."""

from __future__ import annotations

from millm_host.api import operation

from ..routes import _Resource
from ..runtime import Runtime
from . import limits
from .limits import LimitsRequest


class Capacity(_Resource):
    """``/api/models/{model_id}/probe-capacity`` (and ``/measure``), ``/api/models/{model_id}/probe-limits``."""

    @operation("The model's Probe capacity: measurement, budget, recommendation and limits in force", errors=(404,))
    async def on_get(self, req, resp, model_id: str) -> None:
        resp.media = await limits.get_capacity(self.runtime, model_id)

    @operation("Time the loaded model's own step and its probes' costs (needs nothing armed)", errors=(404, 409, 503))
    async def on_post_measure(self, req, resp, model_id: str) -> None:
        await self.json(req, required=False)
        resp.media = await limits.measure_model(self.runtime, model_id)

    @operation(
        "Cancel the model's measurement in progress (it stops at its next run and stores nothing)", errors=(404,)
    )
    async def on_delete_measure(self, req, resp, model_id: str) -> None:
        resp.media = await limits.cancel_measure(self.runtime, model_id)

    @operation("Approve the recommendation, or override it (percent or ms)", request=LimitsRequest, errors=(404, 409))
    async def on_put_limits(self, req, resp, model_id: str) -> None:
        body = await self.json(req)
        resp.media = await limits.put_limits(self.runtime, model_id, body)


def install(runtime: Runtime, add_route) -> None:
    capacity = Capacity(runtime)
    add_route("/api/models/{model_id}/probe-capacity", capacity)
    add_route("/api/models/{model_id}/probe-capacity/measure", capacity, suffix="measure")
    add_route("/api/models/{model_id}/probe-limits", capacity, suffix="limits")
