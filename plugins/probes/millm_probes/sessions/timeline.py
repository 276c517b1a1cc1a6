"""Reading and deleting sessions: the list, a session's timeline, its deletion (blocking: call from a worker).

A timeline has one row per turn and one column per behaviour (a probe whose
definition names no behaviour is its own column); each cell holds that turn's
``mi.probe.result/v1`` objects for the column, rule signals beside the probes
(stored after them, so listed after them); a column names its rule expressions in
``rules`` (first seen first), so a reader can lay them out beside the probe results.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from millm_host.api import MillmError, list_page

from ..tables import ProbeEvent
from . import stored_text
from .tables import ProbeSession, ProbeSessionTurn
from .turns import _aware, now

SESSION_LIST_MAX = 500


class SessionNotFound(MillmError):
    status, code, type = 404, "session_not_found", "not_found_error"


def _session_json(row: ProbeSession, idle_minutes: float) -> dict[str, Any]:
    last = _aware(row.last_active_at)
    return {
        "object": "probe.session",
        "id": row.id,
        "source": row.source,
        "ambiguous": row.ambiguous,
        "previous_session_id": row.previous_session_id,
        "turns": row.turns,
        "fired": row.fired,
        "started_at": _aware(row.started_at).isoformat(),
        "last_active_at": last.isoformat(),
        "ended": row.source != "header" and now() - last > timedelta(minutes=idle_minutes),
    }


def list_sessions(
    db: Any,
    idle_minutes: float,
    *,
    source: str | None,
    ambiguous: bool | None,
    fired: bool | None,
    limit: int,
    after: str | None,
) -> dict[str, Any]:
    """Sessions, newest first, as an OpenAI-style page (``after`` is a session id)."""
    query = sa.select(ProbeSession).order_by(ProbeSession.seq.desc())
    if source is not None:
        query = query.where(ProbeSession.source == source)
    if ambiguous is not None:
        query = query.where(ProbeSession.ambiguous.is_(ambiguous))
    if fired is not None:
        query = query.where(ProbeSession.fired > 0 if fired else ProbeSession.fired == 0)
    with db.session() as session:
        if after is not None:
            cursor = session.scalar(sa.select(ProbeSession.seq).where(ProbeSession.id == after))
            if cursor is None:
                raise SessionNotFound(f"no session {after!r} to page after", param="after")
            query = query.where(ProbeSession.seq < cursor)
        rows = list(session.scalars(query.limit(limit + 1)))
        page = [_session_json(r, idle_minutes) for r in rows[:limit]]
    return list_page(page, has_more=len(rows) > limit)


def _column(result: dict[str, Any]) -> str:
    return result.get("behaviour") or result.get("name") or result.get("probe_id") or "?"


def get_timeline(db: Any, idle_minutes: float, session_id: str) -> dict[str, Any]:
    """The session, and one row per turn with a cell per behaviour (no text: that is the transcript's)."""
    with db.session() as session:
        row = session.scalar(sa.select(ProbeSession).where(ProbeSession.id == session_id))
        if row is None:
            raise SessionNotFound(f"no session {session_id!r}", param="session_id")
        out = _session_json(row, idle_minutes)
        turns = list(
            session.execute(
                sa.select(
                    ProbeSessionTurn.turn,
                    ProbeSessionTurn.request_id,
                    ProbeSessionTurn.trace_id,
                    ProbeSessionTurn.endpoint,
                    ProbeSessionTurn.created_at,
                    ProbeSessionTurn.transcript_at,
                )
                .where(ProbeSessionTurn.session_id == session_id)
                .order_by(ProbeSessionTurn.turn)
            )
        )
        events = session.execute(
            sa.select(ProbeEvent.turn, ProbeEvent.result)
            .where(ProbeEvent.session_id == session_id)
            .order_by(ProbeEvent.id)
        )
        cells: dict[int, dict[str, list[dict[str, Any]]]] = {}
        columns: dict[str, dict[str, Any]] = {}
        for turn, result in events:
            key = _column(result)
            column = columns.get(key)
            if column is None:
                kind = "behaviour" if result.get("behaviour") else "probe"
                column = columns[key] = {"key": key, "kind": kind, "rules": []}
            if result.get("kind") == "rule" and result.get("name") not in column["rules"]:
                column["rules"].append(result.get("name"))
            cells.setdefault(turn, {}).setdefault(key, []).append(result)
    out["columns"] = list(columns.values())
    out["timeline"] = [
        {
            "turn": t.turn,
            "request_id": t.request_id,
            "trace_id": t.trace_id,
            "endpoint": t.endpoint,
            "recorded_at": _aware(t.created_at).isoformat(),
            "transcript": t.transcript_at is not None,
            "cells": cells.get(t.turn, {}),
        }
        for t in turns
    ]
    return out


def get_transcript(db: Any, session_id: str) -> dict[str, Any]:
    """The kept text of a session's turns: the newest user message and the visible reply of each."""
    with db.session() as session:
        if session.scalar(sa.select(ProbeSession.seq).where(ProbeSession.id == session_id)) is None:
            raise SessionNotFound(f"no session {session_id!r}", param="session_id")
        rows = session.execute(
            sa.select(
                ProbeSessionTurn.turn,
                ProbeSessionTurn.user_text,
                ProbeSessionTurn.reply_text,
                ProbeSessionTurn.transcript_at,
            )
            .where(ProbeSessionTurn.session_id == session_id, ProbeSessionTurn.transcript_at.is_not(None))
            .order_by(ProbeSessionTurn.turn)
        )
        data = [
            {
                "turn": r.turn,
                "user": stored_text.load(r.user_text),
                "reply": stored_text.load(r.reply_text),
                "recorded_at": _aware(r.transcript_at).isoformat(),
            }
            for r in rows
        ]
    return {"object": "list", "session_id": session_id, "data": data}


def delete_session(db: Any, session_id: str, events: str) -> dict[str, Any]:
    """Remove a session, its turns and their text at once; its verdicts are kept detached, or deleted."""
    with db.engine.begin() as connection:
        gone = connection.execute(sa.delete(ProbeSession).where(ProbeSession.id == session_id)).rowcount
        if not gone:
            raise SessionNotFound(f"no session {session_id!r}", param="session_id")
        turns = connection.execute(sa.delete(ProbeSessionTurn).where(ProbeSessionTurn.session_id == session_id))
        where = ProbeEvent.session_id == session_id
        if events == "delete":
            touched = connection.execute(sa.delete(ProbeEvent).where(where)).rowcount
        else:  # detached: the verdicts stay, the decoded context (text) goes with the session
            touched = connection.execute(
                sa.update(ProbeEvent).where(where).values(session_id=None, turn=None, detail=None)
            ).rowcount
    return {
        "object": "probe.session.deleted",
        "id": session_id,
        "deleted": True,
        "turns": turns.rowcount,
        "events": events,
        "events_affected": touched,
    }
