"""The probes management API: thin Falcon resources over ``arming.manage``, ``serving.stateless`` and ``store``."""

from __future__ import annotations

import asyncio

import falcon

from millm_host.api import InvalidParameter, JsonResource, Param, ResponseModel, operation

from . import store
from .arming import manage
from .arming.manage import ArmRequest, RecalibrationRequest
from .capacity.limits import armed_cost
from .definition import WINDOWS, ProbeDefinition
from .params import bool_param
from .runtime import Runtime
from .serving import stateless
from .serving.stateless import ScoreRequest
from .sessions import routes as session_routes


class ProbeResultCount(ResponseModel):
    probe_id: str | None  # None: results of no probe (rule signals and other plugins' results)
    results: int
    fired: int


class ProbeResultCounts(ResponseModel):
    object: str
    data: list[ProbeResultCount]


class _Resource(JsonResource):
    """A probes route: the host's body reading, and the plugin's runtime."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime.host)
        self.runtime = runtime


class Probes(_Resource):
    """``GET /api/probes``; ``POST /api/probes/import``."""

    @operation("The imported probes")
    async def on_get(self, req, resp) -> None:
        resp.media = await asyncio.to_thread(manage.probe_list, self.runtime)

    @operation(
        "Import a probe definition",
        request=ProbeDefinition,
        status=201,
        errors=(409,),
        query=[Param("on_conflict", {"enum": ["fail", "rename"]}, "What to do when the name exists (default fail)")],
    )
    async def on_post_import(self, req, resp) -> None:
        raw = await self.raw_body(req)  # a definition is stored as the bytes received
        document = await self.parse_json(raw)
        on_conflict = req.get_param("on_conflict") or "fail"
        resp.media = await manage.import_probe(self.runtime, raw, document, on_conflict)
        resp.status = falcon.HTTP_201


class ProbeItem(_Resource):
    """One probe: read, delete, its definition, parity, arming and its bar."""

    @operation("One probe", errors=(404,))
    async def on_get(self, req, resp, probe_id: str) -> None:
        resp.media = await manage.probe_detail(self.runtime, probe_id)

    @operation("Delete a probe", errors=(404, 409))
    async def on_delete(self, req, resp, probe_id: str) -> None:
        resp.media = await manage.delete(self.runtime, probe_id)

    @operation("The definition as imported", errors=(404,))
    async def on_get_definition(self, req, resp, probe_id: str) -> None:
        row = await asyncio.to_thread(store.get_probe, self.runtime.host.db, probe_id)
        resp.content_type = falcon.MEDIA_JSON
        resp.text = row.definition

    @operation("The probe's parity reports", errors=(404,))
    async def on_get_parity(self, req, resp, probe_id: str) -> None:
        await asyncio.to_thread(store.get_probe, self.runtime.host.db, probe_id)
        reports = await asyncio.to_thread(store.parity_reports, self.runtime.host.db, probe_id)
        resp.media = {"object": "list", "data": reports}

    @operation("Check parity on the resident model", errors=(404, 409, 503))
    async def on_post_parity(self, req, resp, probe_id: str) -> None:
        await self.json(req, required=False)
        resp.media = await manage.check_parity(self.runtime, probe_id)

    @operation("Arm the probe", request=ArmRequest, request_required=False, errors=(404, 409, 503))
    async def on_post_arm(self, req, resp, probe_id: str) -> None:
        body = await self.json(req, required=False)
        resp.media = await manage.arm(self.runtime, probe_id, body)

    @operation("Disarm the probe", errors=(404,))
    async def on_post_disarm(self, req, resp, probe_id: str) -> None:
        await self.json(req, required=False)
        resp.media = await manage.disarm(self.runtime, probe_id)

    @operation("Replace the probe's bar", request=RecalibrationRequest, errors=(404, 409))
    async def on_post_recalibrate(self, req, resp, probe_id: str) -> None:
        body = await self.json(req)
        resp.media = await manage.recalibrate(self.runtime, probe_id, body)


class Score(_Resource):
    """``POST /api/probes/score``: stateless scoring."""

    @operation("Score inputs with probes, statelessly", request=ScoreRequest, errors=(404, 409, 503))
    async def on_post(self, req, resp) -> None:
        body = await self.json(req)
        resp.media = await stateless.score(self.runtime, body, self.headers(req))


class Status(_Resource):
    """``GET /api/probes/status``: what is armed, why a quiet probe is quiet, the last overhead."""

    @operation("What is armed, and why a quiet probe is quiet")
    async def on_get(self, req, resp) -> None:
        status = self.runtime.status()
        status["cost"] = await asyncio.to_thread(armed_cost, self.runtime)  # the armed set against the budget
        resp.media = status


class Events(_Resource):
    """``GET /api/probes/events`` and ``GET /api/probes/events/{result_id}`` (the detail, with text)."""

    @operation(
        "Probe results, newest first",
        query=[
            Param("probe_id"),
            Param("result_id"),
            Param("trace_id"),
            Param("fired", {"type": "boolean"}),
            Param("window", {"enum": list(WINDOWS)}),
            Param("limit", {"type": "integer", "minimum": 1, "maximum": store.EVENT_LIST_MAX}),
            Param("after", description="Continue after this cursor"),
        ],
        errors=(404,),
    )
    async def on_get(self, req, resp) -> None:
        window = req.get_param("window")
        if window is not None and window not in WINDOWS:
            raise InvalidParameter(f"window must be one of {', '.join(WINDOWS)}", param="window")
        limit_raw = req.get_param("limit") or "50"
        if not limit_raw.isdigit() or not 1 <= int(limit_raw) <= store.EVENT_LIST_MAX:
            raise InvalidParameter(f"limit is an integer from 1 to {store.EVENT_LIST_MAX}", param="limit")
        resp.media = await asyncio.to_thread(
            store.list_events,
            self.runtime.host.db,
            probe_id=req.get_param("probe_id"),
            result_id=req.get_param("result_id"),
            trace_id=req.get_param("trace_id"),
            fired=bool_param(req, "fired"),
            window=window,
            limit=int(limit_raw),
            after=req.get_param("after"),
        )

    @operation(
        "How many results each probe has, and how many fired: every stored result, under the list's filters",
        response=ProbeResultCounts,
        query=[Param("probe_id"), Param("fired", {"type": "boolean"}), Param("window", {"enum": list(WINDOWS)})],
    )
    async def on_get_counts(self, req, resp) -> None:
        window = req.get_param("window")
        if window is not None and window not in WINDOWS:
            raise InvalidParameter(f"window must be one of {', '.join(WINDOWS)}", param="window")
        counts = await asyncio.to_thread(
            store.count_events,
            self.runtime.host.db,
            probe_id=req.get_param("probe_id"),
            fired=bool_param(req, "fired"),
            window=window,
        )
        resp.media = {"object": "list", "data": counts}

    @operation("One result, with its text", errors=(404,))
    async def on_get_detail(self, req, resp, result_id: str) -> None:
        resp.media = await asyncio.to_thread(store.get_event, self.runtime.host.db, result_id)


def install(runtime: Runtime, add_route) -> None:
    probes, item, events = Probes(runtime), ProbeItem(runtime), Events(runtime)
    add_route("/api/probes", probes)
    add_route("/api/probes/import", probes, suffix="import")
    add_route("/api/probes/score", Score(runtime))
    add_route("/api/probes/status", Status(runtime))
    add_route("/api/probes/events", events)
    add_route("/api/probes/events/counts", events, suffix="counts")  # a literal: never read as a result id
    add_route("/api/probes/events/{result_id}", events, suffix="detail")
    session_routes.install(runtime, add_route)  # sessions, transcripts and the live feed
    add_route("/api/probes/{probe_id}", item)
    for action in ("definition", "parity", "arm", "disarm", "recalibrate"):
        add_route(f"/api/probes/{{probe_id}}/{action}", item, suffix=action)
