"""The tables of sessions and their turns (migration ``probes_sessions_0001``).

A turn keeps its conversation keys (hashes, never text) and, only while
``PROBE_TRANSCRIPTS`` is on, the newest user message and the visible reply.
Turns name their session by id with no foreign key: deleting a session deletes
its turns in the same transaction, and its events are kept (detached) or deleted.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from ..tables import Base


class ProbeSession(Base):
    """One conversation while probes were armed."""

    __tablename__ = "probe_sessions"

    seq: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)  # the listing's order
    id: Mapped[str] = mapped_column(sa.String(128), unique=True)  # as the client named it, or minted
    source: Mapped[str] = mapped_column(sa.String(16))  # header, prefix (a continuation), new
    ambiguous: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    previous_session_id: Mapped[str | None] = mapped_column(sa.String(128))  # the idle session it continues
    turns: Mapped[int] = mapped_column(sa.Integer, default=0)
    fired: Mapped[int] = mapped_column(sa.Integer, default=0)  # results that fired, over every turn
    started_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    last_active_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), index=True)


class ProbeSessionTurn(Base):
    """One monitored request of a session."""

    __tablename__ = "probe_session_turns"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    session_id: Mapped[str] = mapped_column(sa.String(128), index=True)
    turn: Mapped[int] = mapped_column(sa.Integer)
    request_id: Mapped[str | None] = mapped_column(sa.String(64))
    trace_id: Mapped[str | None] = mapped_column(sa.String(32))
    endpoint: Mapped[str] = mapped_column(sa.String(32))
    exact_key: Mapped[str | None] = mapped_column(sa.String(64), index=True)  # the conversation through the reply
    loose_key: Mapped[str | None] = mapped_column(sa.String(64), index=True)  # the same, replies left out
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    user_text: Mapped[str | None] = mapped_column(sa.Text)
    reply_text: Mapped[str | None] = mapped_column(sa.Text)
    transcript_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True), index=True)
