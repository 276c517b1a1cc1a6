"""Routes of sessions and the live feed: thin Falcon resources over ``timeline`` and ``feed.websocket``."""

from __future__ import annotations

import asyncio

from millm_host.api import InvalidParameter, JsonResource, Param, operation

from ..feed.websocket import FeedResource
from ..params import bool_param
from ..runtime import Runtime
from . import timeline


class SessionsResource(JsonResource):
    """``GET /api/probes/sessions``; one session's timeline, transcript and deletion."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime.host)
        self.runtime = runtime

    @property
    def idle_minutes(self) -> float:
        return self.runtime.settings["PROBE_SESSION_IDLE_MINUTES"]

    @operation(
        "Sessions, newest first",
        query=[
            Param("source", {"enum": ["header", "prefix", "new"]}, "How the session was recognised"),
            Param("ambiguous", {"type": "boolean"}, "Only sessions opened because two matched"),
            Param("fired", {"type": "boolean"}, "Only sessions with (or without) a result that fired"),
            Param("limit", {"type": "integer", "minimum": 1, "maximum": timeline.SESSION_LIST_MAX}),
            Param("after", description="Continue after this session id"),
        ],
        errors=(404,),
    )
    async def on_get(self, req, resp) -> None:
        source = req.get_param("source")
        if source is not None and source not in ("header", "prefix", "new"):
            raise InvalidParameter("source must be one of header, prefix, new", param="source")
        limit_raw = req.get_param("limit") or "50"
        if not limit_raw.isdigit() or not 1 <= int(limit_raw) <= timeline.SESSION_LIST_MAX:
            raise InvalidParameter(f"limit is an integer from 1 to {timeline.SESSION_LIST_MAX}", param="limit")
        resp.media = await asyncio.to_thread(
            timeline.list_sessions,
            self.runtime.host.db,
            self.idle_minutes,
            source=source,
            ambiguous=bool_param(req, "ambiguous"),
            fired=bool_param(req, "fired"),
            limit=int(limit_raw),
            after=req.get_param("after"),
        )

    @operation("A session's timeline: a row per turn, a column per behaviour", errors=(404,))
    async def on_get_item(self, req, resp, session_id: str) -> None:
        resp.media = await asyncio.to_thread(timeline.get_timeline, self.runtime.host.db, self.idle_minutes, session_id)

    @operation(
        "Delete a session and its text at once",
        query=[Param("events", {"enum": ["keep", "delete"]}, "keep: the verdicts stay, detached (default)")],
        errors=(404,),
    )
    async def on_delete_item(self, req, resp, session_id: str) -> None:
        events = req.get_param("events") or "keep"
        if events not in ("keep", "delete"):
            raise InvalidParameter("events must be keep or delete", param="events")
        resp.media = await asyncio.to_thread(timeline.delete_session, self.runtime.host.db, session_id, events)

    @operation("A session's kept text: each turn's newest user message and visible reply", errors=(404,))
    async def on_get_transcript(self, req, resp, session_id: str) -> None:
        resp.media = await asyncio.to_thread(timeline.get_transcript, self.runtime.host.db, session_id)


def install(runtime: Runtime, add_route) -> None:
    resource = SessionsResource(runtime)
    add_route("/api/probes/sessions", resource)
    add_route("/api/probes/sessions/{session_id}", resource, suffix="item")
    add_route("/api/probes/sessions/{session_id}/transcript", resource, suffix="transcript")
    add_route("/api/probes/feed", FeedResource(runtime.feed))  # WebSocket only: not in /openapi.json
