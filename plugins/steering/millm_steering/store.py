"""Stored steering data: registered SAEs, profiles and the lock (blocking; call off the event loop)."""

from __future__ import annotations

import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from millm_host.api import Database
from millm_saelens import SAEConfig

from .errors import Conflict, ProfileNotFound, SAENotFound
from .features import Features
from .state import Profile
from .tables import LockRecord, ProfileRecord, SAERecord

LOCK_ROW = 1


def to_profile(record: ProfileRecord) -> Profile:
    return Profile(record.name, record.sae_id, record.layer, tuple((int(i), float(s)) for i, s in record.features))


class Store:
    """The plugin's rows, through the host's database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- SAEs ---------------------------------------------------------------------------
    def saes(self) -> list[SAERecord]:
        with self.db.session() as session:
            return list(session.scalars(sa.select(SAERecord).order_by(SAERecord.sae_id)))

    def sae(self, sae_id: str) -> SAERecord:
        with self.db.session() as session:
            record = session.get(SAERecord, sae_id)
        if record is None:
            raise SAENotFound(f"no SAE is registered as {sae_id!r}", param="sae_id")
        return record

    def add_sae(self, sae_id: str, path: Path, cfg: SAEConfig) -> SAERecord:
        record = SAERecord(
            sae_id=sae_id,
            path=str(path),
            d_in=cfg.d_in,
            d_sae=cfg.d_sae,
            layer=cfg.layer,
            hook_point=cfg.hook_name,
            architecture=cfg.architecture,
            cfg=cfg.raw,
            created=int(time.time()),
        )
        try:
            with self.db.session() as session, session.begin():
                session.add(record)
        except IntegrityError:
            raise Conflict(f"an SAE is already registered as {sae_id!r}", param="sae_id", code="sae_exists") from None
        return record

    def delete_sae(self, sae_id: str) -> None:
        """Remove a registration; refused while a profile uses it."""
        with self.db.session() as session, session.begin():
            record = session.get(SAERecord, sae_id)
            if record is None:
                raise SAENotFound(f"no SAE is registered as {sae_id!r}", param="sae_id")
            users = list(session.scalars(sa.select(ProfileRecord.name).where(ProfileRecord.sae_id == sae_id)))
            if users:
                raise Conflict(
                    f"SAE {sae_id!r} is used by profiles {', '.join(sorted(users))}; delete them first",
                    param="sae_id",
                    code="sae_in_use",
                )
            session.delete(record)

    # --- profiles -----------------------------------------------------------------------
    def profiles(self) -> list[ProfileRecord]:
        with self.db.session() as session:
            return list(session.scalars(sa.select(ProfileRecord).order_by(ProfileRecord.name)))

    def profile(self, name: str) -> ProfileRecord:
        with self.db.session() as session:
            record = session.get(ProfileRecord, name)
        if record is None:
            raise ProfileNotFound(f"no profile is named {name!r}", param="profile")
        return record

    def add_profile(self, name: str, sae_id: str, layer: int, features: Features) -> ProfileRecord:
        record = ProfileRecord(
            name=name, sae_id=sae_id, layer=layer, features=[list(f) for f in features], created=int(time.time())
        )
        try:
            with self.db.session() as session, session.begin():
                if session.get(SAERecord, sae_id) is None:
                    raise SAENotFound(f"no SAE is registered as {sae_id!r}", param="sae_id")
                session.add(record)
        except IntegrityError:
            raise Conflict(f"a profile is already named {name!r}", param="name", code="profile_exists") from None
        return record

    def delete_profile(self, name: str) -> None:
        with self.db.session() as session, session.begin():
            record = session.get(ProfileRecord, name)
            if record is None:
                raise ProfileNotFound(f"no profile is named {name!r}", param="name")
            session.delete(record)

    # --- the lock -----------------------------------------------------------------------
    def lock(self) -> str | None:
        with self.db.session() as session:
            record = session.get(LockRecord, LOCK_ROW)
            return record.model_id if record is not None else None

    def set_lock(self, model_id: str | None) -> None:
        with self.db.session() as session, session.begin():
            record = session.get(LockRecord, LOCK_ROW)
            if model_id is None:
                if record is not None:
                    session.delete(record)
            elif record is None:
                session.add(LockRecord(id=LOCK_ROW, model_id=model_id, locked=int(time.time())))
            else:
                record.model_id, record.locked = model_id, int(time.time())
