"""The rulesets plugin's tables (its own Alembic history: ``alembic_version_rulesets``)."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    metadata = sa.MetaData()


class RuleSetRow(Base):
    """An imported ``mi.ruleset/v1`` document, stored as received, and whether this build proves it."""

    __tablename__ = "rule_sets"
    __table_args__ = (sa.UniqueConstraint("ruleset_id", "version"),)

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    ruleset_id: Mapped[str] = mapped_column(sa.String(200))
    version: Mapped[str] = mapped_column(sa.String(100))
    document: Mapped[str] = mapped_column(sa.Text)  # the bytes received, decoded
    digest: Mapped[str] = mapped_column(sa.String(80))
    status: Mapped[str] = mapped_column(sa.String(24))  # published | vectors_failed
    status_detail: Mapped[str | None] = mapped_column(sa.Text)  # why the last self-check failed
    checked_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))


class RuleAttachment(Base):
    """A behaviour's rule signals: the set that runs beside its armed probes."""

    __tablename__ = "rule_attachments"

    behaviour: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    rule_set_id: Mapped[str] = mapped_column(sa.ForeignKey("rule_sets.id"), index=True)
    attached_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
