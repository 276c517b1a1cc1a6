"""Routes for behaviour sets (``/api/probes/behaviours``) and each model's Probe capacity."""

from __future__ import annotations

import asyncio

from millm_host.api import operation

from . import behaviours, limits
from .behaviours import BehaviourArmRequest
from .limits import LimitsRequest
from .routes import _Resource
from .runtime import Runtime


class Behaviours(_Resource):
    """``GET /api/probes/behaviours``; ``POST /api/probes/behaviours/{key}/arm`` and ``/disarm``."""

    @operation("Behaviour sets: each with its members and their state, and which were armed before a restart")
    async def on_get(self, req, resp) -> None:
        resp.media = await asyncio.to_thread(behaviours.behaviour_list, self.runtime)

    @operation(
        "Arm a behaviour's probes, all or nothing (dry_run: run every gate, arm nothing)",
        request=BehaviourArmRequest,
        request_required=False,
        errors=(404, 409, 503),
    )
    async def on_post_arm(self, req, resp, key: str) -> None:
        body = await self.json(req, required=False)
        resp.media = await behaviours.arm_behaviour(self.runtime, key, body)

    @operation("Disarm a behaviour's probes (a hook another behaviour uses stays)", errors=(404,))
    async def on_post_disarm(self, req, resp, key: str) -> None:
        await self.json(req, required=False)
        resp.media = await behaviours.disarm_behaviour(self.runtime, key)


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
    sets, capacity = Behaviours(runtime), Capacity(runtime)
    add_route("/api/probes/behaviours", sets)
    add_route("/api/probes/behaviours/{key}/arm", sets, suffix="arm")
    add_route("/api/probes/behaviours/{key}/disarm", sets, suffix="disarm")
    add_route("/api/models/{model_id}/probe-capacity", capacity)
    add_route("/api/models/{model_id}/probe-capacity/measure", capacity, suffix="measure")
    add_route("/api/models/{model_id}/probe-limits", capacity, suffix="limits")
