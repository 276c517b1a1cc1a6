"""Each model's measurement and limits (table ``probe_capacity``; blocking: call from a worker)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

MIGRATIONS = str(Path(__file__).parents[1] / "migrations" / "capacity")  # millm_probes/migrations/capacity


class Base(DeclarativeBase):
    metadata = sa.MetaData()


class Capacity(Base):
    __tablename__ = "probe_capacity"

    model_id: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    measurement: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    limits: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))


def read(db: Any, model_id: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(measurement, limits) of ``model_id``; None where there is none."""
    with db.session() as session:
        row = session.get(Capacity, model_id)
        return (row.measurement, row.limits) if row is not None else (None, None)


def write(db: Any, model_id: str, **values: Any) -> None:
    """Set ``measurement`` and/or ``limits`` of ``model_id``."""
    with db.session() as session:
        row = session.get(Capacity, model_id)
        if row is None:
            row = Capacity(model_id=model_id, measurement=None, limits=None)
            session.add(row)
        for key, value in values.items():
            setattr(row, key, value)
        row.updated_at = datetime.now(UTC)
        session.commit()
