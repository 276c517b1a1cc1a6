"""Routes for behaviour sets (``/api/probes/behaviours``): list them, arm or disarm a whole set in one call."""

from __future__ import annotations

import asyncio

from millm_host.api import operation

from ..routes import _Resource
from ..runtime import Runtime
from . import behaviours
from .behaviours import BehaviourArmRequest


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


def install(runtime: Runtime, add_route) -> None:
    sets = Behaviours(runtime)
    add_route("/api/probes/behaviours", sets)
    add_route("/api/probes/behaviours/{key}/arm", sets, suffix="arm")
    add_route("/api/probes/behaviours/{key}/disarm", sets, suffix="disarm")
