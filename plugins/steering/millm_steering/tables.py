"""This plugin's tables: registered SAEs, saved profiles, the steering lock, imported clusters and circuits,
and the SAEs' feature labels."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Declarative base of the steering plugin (its own metadata)."""


class SAERecord(Base):
    """A registered SAELens directory. ``cfg`` is its ``cfg.json`` as read at registration."""

    __tablename__ = "steering_saes"

    sae_id: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    path: Mapped[str] = mapped_column(sa.Text)
    d_in: Mapped[int] = mapped_column(sa.Integer)
    d_sae: Mapped[int] = mapped_column(sa.Integer)
    layer: Mapped[int] = mapped_column(sa.Integer)
    hook_point: Mapped[str] = mapped_column(sa.Text)
    architecture: Mapped[str] = mapped_column(sa.String(16))
    cfg: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    created: Mapped[int] = mapped_column(sa.Integer)


class ProfileRecord(Base):
    """A saved profile: a feature set on one SAE at one layer. ``features`` is ``[[index, strength], ...]``."""

    __tablename__ = "steering_profiles"

    name: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    sae_id: Mapped[str] = mapped_column(sa.String(200), sa.ForeignKey("steering_saes.sae_id"))
    layer: Mapped[int] = mapped_column(sa.Integer)
    features: Mapped[list[list[Any]]] = mapped_column(sa.JSON)
    created: Mapped[int] = mapped_column(sa.Integer)


class LockRecord(Base):
    """The steering lock: at most one row, the model ``/v1/models`` is narrowed to."""

    __tablename__ = "steering_lock"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    model_id: Mapped[str] = mapped_column(sa.String(400))
    locked: Mapped[int] = mapped_column(sa.Integer)


class ClusterRecord(Base):
    """An imported ``mi.cluster/v1`` document (as received), served as the profile ``profile_name``,
    and its persistent intensity dial."""

    __tablename__ = "steering_clusters"

    cluster_id: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    profile_name: Mapped[str] = mapped_column(sa.String(200), sa.ForeignKey("steering_profiles.name"), unique=True)
    document: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    intensity: Mapped[float] = mapped_column(sa.Float)
    created: Mapped[int] = mapped_column(sa.Integer)


class CircuitRecord(Base):
    """An imported ``mi.circuit/v1`` document (as received) and its persistent intensity dial."""

    __tablename__ = "steering_circuits"

    circuit_id: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    document: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    intensity: Mapped[float] = mapped_column(sa.Float)
    created: Mapped[int] = mapped_column(sa.Integer)


class DesiredRecord(Base):
    """The live steering every replica converges to (one row): attachments, live values, the active
    profile and circuits with their dials, as ``desired.document_of`` writes them."""

    __tablename__ = "steering_desired"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    revision: Mapped[int] = mapped_column(sa.Integer)
    document: Mapped[dict[str, Any]] = mapped_column(sa.JSON)


class LabelRecord(Base):
    """One feature's label (an explanation imported from Neuronpedia or SAELens). ``folded`` is the label
    case-folded in Python, so a search matches the same on SQLite and PostgreSQL."""

    __tablename__ = "steering_feature_labels"

    sae_id: Mapped[str] = mapped_column(sa.String(200), sa.ForeignKey("steering_saes.sae_id"), primary_key=True)
    feature: Mapped[int] = mapped_column(sa.Integer, primary_key=True)
    label: Mapped[str] = mapped_column(sa.Text)
    folded: Mapped[str] = mapped_column(sa.Text)
    explainer: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    method: Mapped[str | None] = mapped_column(sa.Text, nullable=True)
    score: Mapped[float | None] = mapped_column(sa.Float, nullable=True)
    imported: Mapped[int] = mapped_column(sa.Integer)
