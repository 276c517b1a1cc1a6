"""Every process's results in every process: a tail of the events table.

The process that serves a request stores its results (``store.write_events``) and
hands them to its own feed and status at once. Every process also reads the rows
of ``probe_events`` it has not seen, every ``PROBE_TAIL_INTERVAL_MS``, on a thread
of its own, and hands on those another process wrote (gunicorn's other workers,
other replicas on the database), one feed message per request, so a feed client
and ``/api/probes/status`` see all the traffic on the database, each result once.

Rows are read by id. On PostgreSQL a transaction can commit after one that took a
later id, so an id skipped over is held as a gap and read again until it appears
or ``GAP_HOLD_S`` passes (a rolled-back write, or capacity measure's timed write,
never appears). What this process wrote itself is known by its result ids
(``own``), kept only until the tail passes them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from ..tables import ProbeEvent

log = logging.getLogger("millm.probes")

GAP_HOLD_S = 10.0  # how long an id skipped over is read again for (a transaction still open)
BATCH_ROWS = 2000  # rows read at most per pass (the rest at the next)
MAX_GAP = 10_000  # ids skipped over at once that are held as gaps
OWN_HOLD_S = 120.0  # how long this process remembers a result id it wrote (the tail passes it sooner)
MEASURE_PROBES = "pr_measure"  # capacity measure's private probes: rows it deletes at once, never traffic


class Tail:
    """The reader: ``deliver(messages)`` gets each request's results another process wrote, in id order."""

    def __init__(self, db: Any, interval_s: float, deliver: Callable[[list[dict[str, Any]]], None]) -> None:
        self.db, self.interval_s, self.deliver = db, max(0.01, interval_s), deliver
        self.stopping = threading.Event()
        self.high = 0  # the largest id read
        self.gaps: dict[int, float] = {}  # ids below ``high`` not read yet -> when first missed
        self._own: dict[str, float] = {}  # result ids this process wrote -> when
        self._own_lock = threading.Lock()
        self.passes = 0
        self.relayed = 0  # results handed on from other processes
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Begin at the table's end (history is not replayed), then read on a daemon thread."""
        with self.db.engine.connect() as connection:
            self.high = connection.scalar(sa.select(sa.func.max(ProbeEvent.id))) or 0
        self._thread = threading.Thread(target=self._run, name="millm-probe-tail", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wrote(self, results: list[dict[str, Any]]) -> None:
        """Results this process stored and handed on itself: the tail skips them."""
        stamp = time.monotonic()
        with self._own_lock:
            for result in results:
                self._own[result["result_id"]] = stamp

    def _run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            try:
                self.read()
            except Exception:  # the database away for a moment: read again at the next pass
                log.exception("reading other processes' probe results failed")

    def read(self) -> int:
        """One pass: read the rows not seen yet, hand on the others' by request; how many were handed on."""
        now = time.monotonic()
        self.gaps = {i: t for i, t in self.gaps.items() if now - t < GAP_HOLD_S}
        floor = min(self.gaps) - 1 if self.gaps else self.high
        with self.db.engine.connect() as connection:
            rows = connection.execute(
                sa.select(
                    ProbeEvent.id, ProbeEvent.result, ProbeEvent.request_id, ProbeEvent.session_id, ProbeEvent.turn
                )
                .where(ProbeEvent.id > floor)
                .order_by(ProbeEvent.id)
                .limit(BATCH_ROWS)
            ).all()
        by_request: dict[Any, dict[str, Any]] = {}
        with self._own_lock:
            self._own = {k: t for k, t in self._own.items() if now - t < OWN_HOLD_S}
            for row in rows:
                if row.id <= self.high and row.id not in self.gaps:
                    continue  # read at an earlier pass
                self.gaps.pop(row.id, None)
                if row.id > self.high:
                    if row.id - self.high <= MAX_GAP:  # a wider jump is ids spent elsewhere, not open writes
                        self.gaps.update(dict.fromkeys(range(self.high + 1, row.id), now))
                    self.high = row.id
                result = row.result
                if self._own.pop(result.get("result_id"), None) is not None:
                    continue
                if str(result.get("probe_id") or "").startswith(MEASURE_PROBES):
                    continue
                key = (row.request_id, row.session_id, row.turn)
                message = by_request.setdefault(
                    key, {"request_id": row.request_id, "session": row.session_id, "turn": row.turn, "results": []}
                )
                message["results"].append(result)
        self.passes += 1
        messages = list(by_request.values())
        if messages:
            self.relayed += sum(len(m["results"]) for m in messages)
            self.deliver(messages)
        return sum(len(m["results"]) for m in messages)
