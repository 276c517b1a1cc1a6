"""The Batch API's tables: uploaded files, batches, and each batch's lines.

A line's row is the unit of progress: it is written once, with its whole output
line, in the same transaction that marks it done, so a restart knows exactly
which lines still have to run.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    metadata = sa.MetaData()


class StoredFile(Base):
    """An uploaded file (or a batch's output or error file); its bytes are ``<data dir>/files/<id>``."""

    __tablename__ = "batch_files"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    filename: Mapped[str] = mapped_column(sa.String(255))
    purpose: Mapped[str] = mapped_column(sa.String(32), index=True)
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    created_at: Mapped[int] = mapped_column(sa.Integer, index=True)


class Batch(Base):
    """One batch: what it runs, where it stands, and when each status began."""

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    endpoint: Mapped[str] = mapped_column(sa.String(64))
    input_file_id: Mapped[str] = mapped_column(sa.String(40))
    completion_window: Mapped[str] = mapped_column(sa.String(16))
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    model: Mapped[str | None] = mapped_column(sa.String(255))
    metadata_: Mapped[Any] = mapped_column("metadata", sa.JSON, nullable=True)
    errors: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    output_file_id: Mapped[str | None] = mapped_column(sa.String(40))
    error_file_id: Mapped[str | None] = mapped_column(sa.String(40))
    total: Mapped[int] = mapped_column(sa.Integer, default=0)
    completed: Mapped[int] = mapped_column(sa.Integer, default=0)
    failed: Mapped[int] = mapped_column(sa.Integer, default=0)
    created_at: Mapped[int] = mapped_column(sa.Integer, index=True)
    expires_at: Mapped[int] = mapped_column(sa.Integer)
    in_progress_at: Mapped[int | None] = mapped_column(sa.Integer)
    finalizing_at: Mapped[int | None] = mapped_column(sa.Integer)
    completed_at: Mapped[int | None] = mapped_column(sa.Integer)
    failed_at: Mapped[int | None] = mapped_column(sa.Integer)
    expired_at: Mapped[int | None] = mapped_column(sa.Integer)
    cancelling_at: Mapped[int | None] = mapped_column(sa.Integer)
    cancelled_at: Mapped[int | None] = mapped_column(sa.Integer)
    #: The replica running the batch, renewed while it runs; another takes over only once it expires.
    lease_owner: Mapped[str | None] = mapped_column(sa.String(200))
    lease_expires_at: Mapped[float | None] = mapped_column(sa.Float)


class BatchLine(Base):
    """One line of a batch's input: ``pending`` until it has run, then ``done`` (2xx) or ``failed``.

    ``request`` is the line's body (pending lines only need it); ``result`` the
    whole output line, written with the state that says it ran.
    """

    __tablename__ = "batch_lines"

    batch_id: Mapped[str] = mapped_column(sa.ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True)
    line: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    custom_id: Mapped[str] = mapped_column(sa.Text)
    state: Mapped[str] = mapped_column(sa.String(16), index=True)
    request: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
    result: Mapped[Any] = mapped_column(sa.JSON, nullable=True)
