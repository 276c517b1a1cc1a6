"""The retention pass: expired transcript text and decoded context, then expired verdicts and sessions.

It runs on a thread of its own every ``PROBE_RETENTION_INTERVAL_S`` seconds, never
on the event loop, so serving never waits for it; each step is one statement.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from ..tables import ProbeEvent
from .tables import ProbeSession, ProbeSessionTurn
from .turns import now

log = logging.getLogger("millm.probes")


def sweep(db: Any, settings: Any) -> dict[str, int]:
    """One pass; returns what each step removed."""
    stamp = now()
    text_cutoff = stamp - timedelta(days=settings["PROBE_TRANSCRIPT_MAX_AGE_DAYS"])
    max_turns = max(0, settings["PROBE_TRANSCRIPT_MAX_TURNS"])
    no_text = {"user_text": None, "reply_text": None, "transcript_at": None}
    done: dict[str, int] = {}
    with db.engine.begin() as connection:
        done["transcripts_expired"] = connection.execute(
            sa.update(ProbeSessionTurn).where(ProbeSessionTurn.transcript_at < text_cutoff).values(**no_text)
        ).rowcount
        # Past the cap, the oldest text goes first.
        newest_dropped = connection.scalar(
            sa.select(ProbeSessionTurn.id)
            .where(ProbeSessionTurn.transcript_at.is_not(None))
            .order_by(ProbeSessionTurn.id.desc())
            .offset(max_turns)
            .limit(1)
        )
        done["transcripts_over_cap"] = (
            connection.execute(
                sa.update(ProbeSessionTurn)
                .where(ProbeSessionTurn.id <= newest_dropped, ProbeSessionTurn.transcript_at.is_not(None))
                .values(**no_text)
            ).rowcount
            if newest_dropped is not None
            else 0
        )
        done["contexts_expired"] = connection.execute(
            sa.update(ProbeEvent)
            .where(ProbeEvent.created_at < text_cutoff, ProbeEvent.detail.is_not(None))
            .values(detail=sa.null())
        ).rowcount
        days = settings["PROBE_EVENT_MAX_AGE_DAYS"]
        if days and days > 0:
            cutoff = stamp - timedelta(days=days)
            done["events_expired"] = connection.execute(
                sa.delete(ProbeEvent).where(ProbeEvent.created_at < cutoff)
            ).rowcount
            expired = sa.select(ProbeSession.id).where(ProbeSession.last_active_at < cutoff)
            connection.execute(sa.delete(ProbeSessionTurn).where(ProbeSessionTurn.session_id.in_(expired)))
            done["sessions_expired"] = connection.execute(
                sa.delete(ProbeSession).where(ProbeSession.last_active_at < cutoff)
            ).rowcount
    return done


class Retention:
    """The background pass: a daemon thread that sweeps, then waits the interval (or until stopped)."""

    def __init__(self, db: Any, settings: Any) -> None:
        self.db, self.settings = db, settings
        self.stopping = threading.Event()
        self.passes = 0
        self.last: dict[str, int] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="millm-probe-retention", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = max(0.05, float(self.settings["PROBE_RETENTION_INTERVAL_S"]))
        while not self.stopping.wait(interval):
            try:
                self.last = sweep(self.db, self.settings)
                self.passes += 1
            except Exception:  # the next pass tries again; serving is never affected
                log.exception("probe retention pass failed")

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(10)
