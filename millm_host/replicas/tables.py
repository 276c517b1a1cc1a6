"""The host's replica table (its own Alembic history: ``alembic_version_replicas``).

One row per running replica: a heartbeat (so a replica can tell whether it is
alone) and its last convergence report.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    metadata = sa.MetaData()


class Replica(Base):
    __tablename__ = "millm_replicas"

    replica_id: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    started_at: Mapped[float] = mapped_column(sa.Float)
    heartbeat_at: Mapped[float] = mapped_column(sa.Float, index=True)
    converged: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    reasons: Mapped[Any] = mapped_column(sa.JSON, nullable=True)  # why not converged, one line each
