"""The probes plugin's tables (its own Alembic history: ``alembic_version_probes``).

Events keep a plain ``probe_id`` with no foreign key: a probe's results outlive
the probe, and are listed as other results once it is deleted.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    metadata = sa.MetaData()


class Probe(Base):
    """An imported definition, stored verbatim, and its bar as it stands now."""

    __tablename__ = "probes"

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    behaviour: Mapped[str | None] = mapped_column(sa.String(200))
    version: Mapped[str | None] = mapped_column(sa.Text)
    provenance_probe_id: Mapped[str | None] = mapped_column(sa.Text)
    definition: Mapped[str] = mapped_column(sa.Text)  # the document exactly as received
    detector_digest: Mapped[str] = mapped_column(sa.String(80))
    detector_digest_source: Mapped[str] = mapped_column(sa.String(16))
    decision: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    decision_digest: Mapped[str] = mapped_column(sa.String(80))
    decision_digest_source: Mapped[str] = mapped_column(sa.String(16))
    decision_revision: Mapped[int] = mapped_column(sa.Integer, default=1)
    threshold_revision: Mapped[int] = mapped_column(sa.Integer, default=1)
    armed: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    armed_at: Mapped[datetime | None] = mapped_column(sa.DateTime(timezone=True))
    armed_load_id: Mapped[str | None] = mapped_column(sa.String(32))
    disarmed_reason: Mapped[str | None] = mapped_column(sa.String(40))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))


class Acknowledgement(Base):
    """Why someone armed a probe below rung 2: kept apart from the exporter's acknowledgement."""

    __tablename__ = "probe_acknowledgements"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    probe_id: Mapped[str] = mapped_column(sa.ForeignKey("probes.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(sa.Text)
    rung: Mapped[int] = mapped_column(sa.Integer)
    model_load_id: Mapped[str | None] = mapped_column(sa.String(32))
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))


class ParityReport(Base):
    __tablename__ = "probe_parity_reports"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    probe_id: Mapped[str] = mapped_column(sa.ForeignKey("probes.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(sa.String(24))
    model_id: Mapped[str | None] = mapped_column(sa.Text)
    model_load_id: Mapped[str | None] = mapped_column(sa.String(32))
    report: Mapped[Any] = mapped_column(sa.JSON)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))


class Recalibration(Base):
    """A moved bar: the decision before and after, and the revisions it moved to."""

    __tablename__ = "probe_recalibrations"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    probe_id: Mapped[str] = mapped_column(sa.ForeignKey("probes.id", ondelete="CASCADE"), index=True)
    previous: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    decision: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    decision_digest: Mapped[str] = mapped_column(sa.String(80))
    decision_revision: Mapped[int] = mapped_column(sa.Integer)
    threshold_revision: Mapped[int] = mapped_column(sa.Integer)
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))


class ProbeEvent(Base):
    """One stored ``mi.probe.result/v1`` object, with the columns its filters use."""

    __tablename__ = "probe_events"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    result_id: Mapped[str] = mapped_column(sa.String(36), unique=True)
    probe_id: Mapped[str | None] = mapped_column(sa.String(32), index=True)
    request_id: Mapped[str | None] = mapped_column(sa.String(64))
    trace_id: Mapped[str] = mapped_column(sa.String(32), index=True)
    window: Mapped[str] = mapped_column(sa.String(16))
    outcome: Mapped[str] = mapped_column(sa.String(16))
    fired: Mapped[bool | None] = mapped_column(sa.Boolean)
    result: Mapped[Any] = mapped_column(sa.JSON)
    detail: Mapped[Any] = mapped_column(sa.JSON, nullable=True)  # decoded text: served by the detail route only
    created_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True), index=True)
    session_id: Mapped[str | None] = mapped_column(sa.String(128), index=True)  # None: no session, or detached
    turn: Mapped[int | None] = mapped_column(sa.Integer)
