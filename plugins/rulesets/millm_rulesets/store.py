"""Reading and writing the rulesets plugin's tables (blocking: call from a worker thread)."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from .errors import RuleSetAttached, RuleSetExists, RuleSetNotFound
from .tables import RuleAttachment, RuleSetRow


def now() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return "rs_" + secrets.token_hex(6)


def insert(db: Any, row: RuleSetRow) -> RuleSetRow:
    with db.session() as session:
        taken = session.scalar(
            sa.select(RuleSetRow.id).where(RuleSetRow.ruleset_id == row.ruleset_id, RuleSetRow.version == row.version)
        )
        if taken is None:
            session.add(row)
            try:
                session.commit()
                return row
            except IntegrityError:
                session.rollback()
                taken = "(a concurrent import)"
    raise RuleSetExists(
        f"rule set {row.ruleset_id!r} version {row.version!r} is already imported ({taken}); delete it or "
        "import a new version",
        param="/version",
    )


def get(db: Any, rule_set_id: str) -> RuleSetRow:
    with db.session() as session:
        row = session.get(RuleSetRow, rule_set_id)
    if row is None:
        raise RuleSetNotFound(f"no rule set {rule_set_id!r}", param="rule_set_id")
    return row


def ids(db: Any) -> list[str]:
    """Every stored set's id (a few bytes each: what convergence reads each pass)."""
    with db.session() as session:
        return list(session.scalars(sa.select(RuleSetRow.id)))


def all_rows(db: Any) -> list[RuleSetRow]:
    with db.session() as session:
        return list(session.scalars(sa.select(RuleSetRow).order_by(RuleSetRow.created_at, RuleSetRow.id)))


def set_status(db: Any, rule_set_id: str, status: str, detail: str | None) -> None:
    with db.session() as session:
        session.execute(
            sa.update(RuleSetRow)
            .where(RuleSetRow.id == rule_set_id)
            .values(status=status, status_detail=detail, checked_at=now())
        )
        session.commit()


def delete(db: Any, rule_set_id: str) -> None:
    with db.session() as session:
        if session.get(RuleSetRow, rule_set_id) is None:
            raise RuleSetNotFound(f"no rule set {rule_set_id!r}", param="rule_set_id")
        attached = list(
            session.scalars(sa.select(RuleAttachment.behaviour).where(RuleAttachment.rule_set_id == rule_set_id))
        )
        if attached:
            raise RuleSetAttached(
                f"rule set {rule_set_id!r} is attached to {', '.join(map(repr, attached))}; detach it first "
                "(DELETE /api/probes/behaviours/{key}/rule-signals)",
                param="rule_set_id",
            )
        session.execute(sa.delete(RuleSetRow).where(RuleSetRow.id == rule_set_id))
        session.commit()


def attachments(db: Any) -> dict[str, tuple[str, datetime]]:
    with db.session() as session:
        return {a.behaviour: (a.rule_set_id, a.attached_at) for a in session.scalars(sa.select(RuleAttachment))}


def attach(db: Any, behaviour: str, rule_set_id: str) -> datetime:
    stamp = now()
    with db.session() as session:
        row = session.get(RuleAttachment, behaviour)
        if row is None:
            session.add(RuleAttachment(behaviour=behaviour, rule_set_id=rule_set_id, attached_at=stamp))
        else:
            row.rule_set_id, row.attached_at = rule_set_id, stamp
        session.commit()
    return stamp


def detach(db: Any, behaviour: str) -> bool:
    with db.session() as session:
        result = session.execute(sa.delete(RuleAttachment).where(RuleAttachment.behaviour == behaviour))
        session.commit()
        return bool(result.rowcount)
