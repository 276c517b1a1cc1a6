"""Reading and writing the probes plugin's tables (blocking: call from a worker or the engine thread)."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.exc import IntegrityError

from millm_host.api import list_page

from .definition import Decision, parse
from .errors import NameConflict, ProbeNotFound, ResultNotFound
from .results import ProbeView
from .tables import Acknowledgement, ParityReport, Probe, ProbeEvent, Recalibration

EVENT_LIST_MAX = 500


def now() -> datetime:
    return datetime.now(UTC)


def new_probe_id() -> str:
    return "pr_" + secrets.token_hex(6)


def view_of(row: Probe, definition_text: str | None = None) -> ProbeView:
    """The probe as results see it: its verbatim definition and its current bar (``definition_text``: the
    definition read apart, for a row listed without it)."""
    definition = parse(json.loads(row.definition if definition_text is None else definition_text))
    return ProbeView(
        probe_id=row.id,
        name=row.name,
        behaviour=row.behaviour,
        version=row.version,
        definition=definition,
        decision=Decision.model_validate(row.decision) if row.decision is not None else None,
        decision_digest=row.decision_digest,
        decision_revision=row.decision_revision,
        threshold_revision=row.threshold_revision,
        detector_digest=row.detector_digest,
        detector_digest_source=row.detector_digest_source,
    )


def insert_probe(db: Any, row: Probe, on_conflict: str) -> Probe:
    """Store a new probe; a taken name fails (409) or is renamed ``name (2)``, ``name (3)``, …"""
    base = row.name
    attempt = 1
    while True:
        with db.session() as session:
            taken = session.scalar(sa.select(Probe.id).where(Probe.name == row.name))
            if taken is None:
                session.add(row)
                try:
                    session.commit()
                    return row
                except IntegrityError:  # a concurrent import took the name
                    session.rollback()
            elif on_conflict == "fail":
                raise NameConflict(
                    f"a probe named {row.name!r} already exists ({taken}); import with on_conflict=rename, "
                    f"or disarm, delete and import again",
                    param="name",
                )
        attempt += 1
        row.name = f"{base} ({attempt})"


def get_probe(db: Any, probe_id: str) -> Probe:
    with db.session() as session:
        row = session.get(Probe, probe_id)
        if row is None:
            raise ProbeNotFound(f"no probe {probe_id!r}", param="probe_id")
        return row


def list_probes(db: Any) -> list[Probe]:
    """Every imported probe, without its definition (tens of kilobytes each: ``definitions`` reads them, and
    ``Runtime.views`` reads only those it has not parsed yet), so listing a thousand probes stays cheap."""
    with db.session() as session:
        query = sa.select(Probe).options(orm.defer(Probe.definition, raiseload=True))
        return list(session.scalars(query.order_by(Probe.created_at, Probe.id)))


def probe_states(db: Any) -> list[Any]:
    """Every probe's set membership and desired state, as plain rows (id, name, behaviour, version,
    detector_digest, armed, decision_revision): what each import and every convergence pass reads, a
    few bytes a probe."""
    columns = (Probe.id, Probe.name, Probe.behaviour, Probe.version, Probe.detector_digest)
    query = sa.select(*columns, Probe.armed, Probe.decision_revision).order_by(Probe.created_at, Probe.id)
    with db.engine.connect() as connection:
        return list(connection.execute(query))


def has_definition(row: Probe) -> bool:
    """Whether ``row`` was read with its definition (``list_probes`` leaves it out)."""
    return "definition" not in sa.inspect(row).unloaded


def definitions(db: Any, probe_ids: Sequence[str]) -> dict[str, str]:
    """probe id -> its stored definition, in one query per thousand ids."""
    ids, found = list(probe_ids), {}
    with db.session() as session:
        for start in range(0, len(ids), 1000):
            query = sa.select(Probe.id, Probe.definition).where(Probe.id.in_(ids[start : start + 1000]))
            found.update({probe_id: text for probe_id, text in session.execute(query)})
    return found


def find_probes(db: Any, ids: Sequence[str], *, strict: bool = True) -> list[Probe]:
    """The probes ``ids`` names, in that order; 404 naming the first unknown one (``strict``), else the
    unknown ones left out (deleted meanwhile)."""
    with db.session() as session:
        rows = {r.id: r for r in session.scalars(sa.select(Probe).where(Probe.id.in_(list(ids))))}
    for i, probe_id in enumerate(ids):
        if probe_id not in rows and strict:
            raise ProbeNotFound(f"no probe {probe_id!r}", param=f"probe_ids[{i}]")
    return [rows[i] for i in ids if i in rows]


def delete_probe(db: Any, probe_id: str) -> None:
    with db.session() as session:
        session.execute(sa.delete(Probe).where(Probe.id == probe_id))
        session.commit()


def set_armed(db: Any, probe_id: str | Sequence[str], load_id: str) -> None:
    """Mark one probe, or several in one transaction, armed (the desired state)."""
    ids = [probe_id] if isinstance(probe_id, str) else list(probe_id)
    with db.session() as session:
        for start in range(0, len(ids), 1000):
            session.execute(
                sa.update(Probe)
                .where(Probe.id.in_(ids[start : start + 1000]))
                .values(armed=True, armed_at=now(), armed_load_id=load_id, disarmed_reason=None)
            )
        session.commit()


def set_disarmed(db: Any, reason: str, probe_id: str | Sequence[str] | None = None) -> None:
    """Disarm one probe, several in one transaction, or every armed probe when ``probe_id`` is None."""
    with db.session() as session:
        query = sa.update(Probe).where(Probe.armed.is_(True))
        if probe_id is None:
            session.execute(query.values(armed=False, disarmed_reason=reason))
        else:
            ids = [probe_id] if isinstance(probe_id, str) else list(probe_id)
            for start in range(0, len(ids), 1000):
                chunk = query.where(Probe.id.in_(ids[start : start + 1000]))
                session.execute(chunk.values(armed=False, disarmed_reason=reason))
        session.commit()


def add_acknowledgement(db: Any, probe_id: str, text: str, rung: int, load_id: str | None) -> None:
    add_acknowledgements(db, [(probe_id, rung)], text, load_id)


def add_acknowledgements(db: Any, probes: Sequence[tuple[str, int]], text: str, load_id: str | None) -> None:
    """One acknowledgement for each (probe id, rung), in one transaction (a behaviour's set)."""
    stamp = now()
    with db.session() as session:
        for probe_id, rung in probes:
            session.add(
                Acknowledgement(probe_id=probe_id, text=text, rung=rung, model_load_id=load_id, created_at=stamp)
            )
        session.commit()


def acknowledgements(db: Any, probe_id: str) -> list[dict[str, Any]]:
    with db.session() as session:
        rows = session.scalars(
            sa.select(Acknowledgement).where(Acknowledgement.probe_id == probe_id).order_by(Acknowledgement.id)
        )
        return [
            {"text": a.text, "rung": a.rung, "model_load_id": a.model_load_id, "created_at": a.created_at.isoformat()}
            for a in rows
        ]


def add_parity_report(db: Any, report: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
    """Store one parity report, or several in one transaction (a behaviour's set)."""
    reports = [report] if isinstance(report, dict) else list(report)
    if not reports:
        return
    stamp = now()
    rows = [
        {
            "id": r["report_id"],
            "probe_id": r["probe_id"],
            "status": r["status"],
            "model_id": r["model"]["id"],
            "model_load_id": r["model"]["load_id"],
            "report": r,
            "created_at": stamp,
        }
        for r in reports
    ]
    with db.engine.begin() as connection:
        connection.execute(sa.insert(ParityReport), rows)


def parity_reports(db: Any, probe_id: str, limit: int = 20) -> list[dict[str, Any]]:
    """Stored reports, newest first."""
    with db.session() as session:
        rows = session.scalars(
            sa.select(ParityReport)
            .where(ParityReport.probe_id == probe_id)
            .order_by(ParityReport.created_at.desc())
            .limit(limit)
        )
        return [r.report for r in rows]


def latest_parity_reports(db: Any, probe_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Each probe's newest stored report, in one query (a probe never checked is absent)."""
    newest = sa.func.row_number().over(partition_by=ParityReport.probe_id, order_by=ParityReport.created_at.desc())
    ranked = (
        sa.select(ParityReport.probe_id, ParityReport.report, newest.label("rank"))
        .where(ParityReport.probe_id.in_(list(probe_ids)))
        .subquery()
    )
    with db.session() as session:
        rows = session.execute(sa.select(ranked.c.probe_id, ranked.c.report).where(ranked.c.rank == 1))
        return {probe_id: report for probe_id, report in rows}


def recalibrate(db: Any, probe_id: str, decision: dict[str, Any] | None, digest: str, source: str) -> Probe:
    """Move the bar: store the new decision, bump both revisions, record the change."""
    with db.session() as session:
        row = session.get(Probe, probe_id)
        if row is None:
            raise ProbeNotFound(f"no probe {probe_id!r}", param="probe_id")
        previous = row.decision
        row.decision, row.decision_digest, row.decision_digest_source = decision, digest, source
        row.decision_revision += 1
        row.threshold_revision += 1
        session.add(
            Recalibration(
                probe_id=probe_id,
                previous=previous,
                decision=decision,
                decision_digest=digest,
                decision_revision=row.decision_revision,
                threshold_revision=row.threshold_revision,
                created_at=now(),
            )
        )
        session.commit()
        return row


def recalibrations(db: Any, probe_id: str) -> list[dict[str, Any]]:
    with db.session() as session:
        rows = session.scalars(
            sa.select(Recalibration).where(Recalibration.probe_id == probe_id).order_by(Recalibration.id)
        )
        return [
            {
                "decision_revision": r.decision_revision,
                "threshold_revision": r.threshold_revision,
                "decision_digest": r.decision_digest,
                "previous": r.previous,
                "decision": r.decision,
                "created_at": r.created_at.isoformat(),
            }
            for r in rows
        ]


# --- events ------------------------------------------------------------------------------


def event_rows(
    results: Sequence[dict[str, Any]],
    details: Sequence[dict[str, Any] | None],
    session_id: str | None = None,
    turn: int | None = None,
) -> list[dict[str, Any]]:
    """A request's results as ``probe_events`` rows."""
    stamp = now()
    return [
        {
            "result_id": r["result_id"],
            "probe_id": r["probe_id"],
            "request_id": r["request_id"],
            "trace_id": r["trace_id"],
            "window": r["window"],
            "outcome": r["outcome"],
            "fired": r["fires"],
            "result": r,
            "detail": detail,
            "created_at": stamp,
            "session_id": session_id,
            "turn": turn,
        }
        for r, detail in zip(results, details, strict=True)
    ]


def write_events(
    db: Any,
    results: Sequence[dict[str, Any]],
    details: Sequence[dict[str, Any] | None],
    session_id: str | None = None,
    turn: int | None = None,
) -> None:
    """Store a request's results in one transaction (a Core insert: this runs on the request path)."""
    rows = event_rows(results, details, session_id, turn)
    with db.engine.begin() as connection:
        connection.execute(sa.insert(ProbeEvent), rows)


def time_write(db: Any, results: Sequence[dict[str, Any]]) -> float:
    """Seconds that storing ``results`` as one request's events takes, as ``write_events`` stores them; the rows
    are deleted in the same transaction, so nothing is left and no reader ever sees them (capacity measure)."""
    began = time.perf_counter()
    rows = event_rows(results, [None] * len(results))
    with db.engine.begin() as connection:
        connection.execute(sa.insert(ProbeEvent), rows)
        took = time.perf_counter() - began
        ids = [r["result_id"] for r in rows]
        connection.execute(sa.delete(ProbeEvent).where(ProbeEvent.result_id.in_(ids)))
        mark = time.perf_counter()
    return took + time.perf_counter() - mark  # the commit, not the delete


def revise_events(db: Any, results: Sequence[dict[str, Any]]) -> int:
    """Replace stored results of another plugin (never a probe's), by ``result_id``; how many were stored."""
    replaced = 0
    with db.engine.begin() as connection:
        for r in results:
            if r.get("kind") == "probe":
                continue  # a probe result is final when stored: nothing revises it
            done = connection.execute(
                sa.update(ProbeEvent)
                .where(ProbeEvent.result_id == r["result_id"], ProbeEvent.probe_id.is_(None))
                .values(outcome=r["outcome"], fired=r["fires"], result=r)
            )
            replaced += done.rowcount or 0
    return replaced


def list_events(
    db: Any,
    *,
    probe_id: str | None,
    result_id: str | None,
    trace_id: str | None,
    fired: bool | None,
    window: str | None,
    limit: int,
    after: str | None,
) -> dict[str, Any]:
    """Stored results, newest first, as an OpenAI-style page (``after`` is a result id)."""
    query = sa.select(ProbeEvent).order_by(ProbeEvent.id.desc())
    for column, value in (
        (ProbeEvent.probe_id, probe_id),
        (ProbeEvent.result_id, result_id),
        (ProbeEvent.trace_id, trace_id),
        (ProbeEvent.window, window),
    ):
        if value is not None:
            query = query.where(column == value)
    if fired is not None:
        query = query.where(ProbeEvent.fired.is_(fired))
    with db.session() as session:
        if after is not None:
            cursor = session.scalar(sa.select(ProbeEvent.id).where(ProbeEvent.result_id == after))
            if cursor is None:
                raise ResultNotFound(f"no result {after!r} to page after", param="after")
            query = query.where(ProbeEvent.id < cursor)
        rows = list(session.scalars(query.limit(limit + 1)))
    page = [r.result for r in rows[:limit]]
    return list_page(page, has_more=len(rows) > limit, id_key="result_id")


def count_events(db: Any, *, probe_id: str | None, fired: bool | None, window: str | None) -> list[dict[str, Any]]:
    """How many stored results each probe has, and how many of them fired, under ``list_events``' filters:
    every stored result, not one page of them (a page shows the newest; its totals would stop there)."""
    fired_count = sa.func.count().filter(ProbeEvent.fired.is_(True))
    query = sa.select(ProbeEvent.probe_id, sa.func.count(), fired_count).group_by(ProbeEvent.probe_id)
    for column, value in ((ProbeEvent.probe_id, probe_id), (ProbeEvent.window, window)):
        if value is not None:
            query = query.where(column == value)
    if fired is not None:
        query = query.where(ProbeEvent.fired.is_(fired))
    with db.session() as session:
        rows = session.execute(query.order_by(ProbeEvent.probe_id)).all()
    return [{"probe_id": key, "results": results, "fired": fired_n} for key, results, fired_n in rows]


def get_event(db: Any, result_id: str) -> dict[str, Any]:
    with db.session() as session:
        row = session.scalar(sa.select(ProbeEvent).where(ProbeEvent.result_id == result_id))
        if row is None:
            raise ResultNotFound(f"no result {result_id!r}", param="result_id")
        return {**row.result, "detail": row.detail}
