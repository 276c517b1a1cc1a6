"""Stored steering data: registered SAEs, profiles, the lock, imported clusters and circuits, feature
labels (blocking; call off the event loop)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from millm_host.api import Database
from millm_saelens import SAEConfig

from .documents import ClusterDoc, read_cluster
from .errors import CircuitNotFound, ClusterNotFound, Conflict, LabelNotFound, ProfileNotFound, SAENotFound
from .features import Features
from .labels import Label
from .state import Profile
from .tables import CircuitRecord, ClusterRecord, LabelRecord, LockRecord, ProfileRecord, SAERecord

LOCK_ROW = 1
#: Feature indices per ``IN (...)`` (SQLite allows 32,766 bound values; PostgreSQL more).
IN_CHUNK = 500


def to_profile(record: ProfileRecord, cluster: ClusterRecord | None = None) -> Profile:
    """The profile as steering applies it; a cluster's carries its declared range and stored dial."""
    features = tuple((int(i), float(s)) for i, s in record.features)
    if cluster is None:
        return Profile(record.name, record.sae_id, record.layer, features)
    declared = read_cluster(cluster.document).intensity_range
    return Profile(record.name, record.sae_id, record.layer, features, cluster.cluster_id, declared, cluster.intensity)


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
            session.execute(sa.delete(LabelRecord).where(LabelRecord.sae_id == sae_id))  # its labels go with it
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

    def cluster_of(self, name: str) -> ClusterRecord | None:
        """The cluster a profile was imported from (None for a saved profile)."""
        with self.db.session() as session:
            return session.scalars(sa.select(ClusterRecord).where(ClusterRecord.profile_name == name)).first()

    def load_profile(self, name: str) -> Profile:
        """The profile ``name`` as steering applies it (404 ``profile_not_found``)."""
        return to_profile(self.profile(name), self.cluster_of(name))

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
            cluster = session.scalars(sa.select(ClusterRecord).where(ClusterRecord.profile_name == name)).first()
            if cluster is not None:
                raise Conflict(
                    f"profile {name!r} is cluster {cluster.cluster_id!r}; delete it with DELETE /api/clusters/"
                    f"{cluster.cluster_id}",
                    param="name",
                    code="profile_is_cluster",
                )
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

    # --- clusters -----------------------------------------------------------------------
    def clusters(self) -> list[tuple[ClusterRecord, ProfileRecord]]:
        with self.db.session() as session:
            rows = session.execute(
                sa.select(ClusterRecord, ProfileRecord)
                .join(ProfileRecord, ProfileRecord.name == ClusterRecord.profile_name)
                .order_by(ClusterRecord.cluster_id)
            )
            return [(c, p) for c, p in rows]

    def cluster(self, cluster_id: str) -> tuple[ClusterRecord, ProfileRecord]:
        with self.db.session() as session:
            record = session.get(ClusterRecord, cluster_id)
            profile = None if record is None else session.get(ProfileRecord, record.profile_name)
        if record is None or profile is None:
            raise ClusterNotFound(f"no cluster is imported as {cluster_id!r}", param="cluster_id")
        return record, profile

    def add_cluster(self, document: dict, cluster: ClusterDoc) -> tuple[ClusterRecord, ProfileRecord]:
        """Import: the document as received, and the profile it is served as (named by the cluster's name)."""
        now = int(time.time())
        profile = ProfileRecord(
            name=cluster.name,
            sae_id=cluster.sae_id,
            layer=cluster.layer,
            features=[list(f) for f in cluster.features],
            created=now,
        )
        record = ClusterRecord(
            cluster_id=cluster.cluster_id, profile_name=cluster.name, document=document, intensity=1.0, created=now
        )
        with self.db.session() as session, session.begin():
            if session.get(SAERecord, cluster.sae_id) is None:
                raise SAENotFound(f"no SAE is registered as {cluster.sae_id!r}", param="sae_id")
            if session.get(ClusterRecord, cluster.cluster_id) is not None:
                raise Conflict(
                    f"a cluster is already imported as {cluster.cluster_id!r}",
                    param="cluster_id",
                    code="cluster_exists",
                )
            if session.get(ProfileRecord, cluster.name) is not None:
                raise Conflict(f"a profile is already named {cluster.name!r}", param="name", code="profile_exists")
            session.add(profile)
            session.flush()
            session.add(record)
        return record, profile

    def delete_cluster(self, cluster_id: str) -> str:
        """Forget a cluster and its profile; returns the profile's name."""
        with self.db.session() as session, session.begin():
            record = session.get(ClusterRecord, cluster_id)
            if record is None:
                raise ClusterNotFound(f"no cluster is imported as {cluster_id!r}", param="cluster_id")
            name = record.profile_name
            session.delete(record)
            session.flush()
            profile = session.get(ProfileRecord, name)
            if profile is not None:
                session.delete(profile)
        return name

    def set_cluster_intensity(self, cluster_id: str, intensity: float) -> None:
        with self.db.session() as session, session.begin():
            record = session.get(ClusterRecord, cluster_id)
            if record is None:
                raise ClusterNotFound(f"no cluster is imported as {cluster_id!r}", param="cluster_id")
            record.intensity = intensity

    # --- circuits -----------------------------------------------------------------------
    def circuits(self) -> list[CircuitRecord]:
        with self.db.session() as session:
            return list(session.scalars(sa.select(CircuitRecord).order_by(CircuitRecord.circuit_id)))

    def circuit(self, circuit_id: str) -> CircuitRecord:
        with self.db.session() as session:
            record = session.get(CircuitRecord, circuit_id)
        if record is None:
            raise CircuitNotFound(f"no circuit is imported as {circuit_id!r}", param="circuit_id")
        return record

    def add_circuit(self, circuit_id: str, document: dict) -> CircuitRecord:
        record = CircuitRecord(circuit_id=circuit_id, document=document, intensity=1.0, created=int(time.time()))
        try:
            with self.db.session() as session, session.begin():
                session.add(record)
        except IntegrityError:
            raise Conflict(
                f"a circuit is already imported as {circuit_id!r}", param="circuit_id", code="circuit_exists"
            ) from None
        return record

    def delete_circuit(self, circuit_id: str) -> None:
        with self.db.session() as session, session.begin():
            record = session.get(CircuitRecord, circuit_id)
            if record is None:
                raise CircuitNotFound(f"no circuit is imported as {circuit_id!r}", param="circuit_id")
            session.delete(record)

    def set_circuit_intensity(self, circuit_id: str, intensity: float) -> CircuitRecord:
        with self.db.session() as session, session.begin():
            record = session.get(CircuitRecord, circuit_id)
            if record is None:
                raise CircuitNotFound(f"no circuit is imported as {circuit_id!r}", param="circuit_id")
            record.intensity = intensity
        return record

    # --- feature labels -------------------------------------------------------------------
    def store_labels(self, sae_id: str, labels: Iterable[Label], mode: str) -> int:
        """Store an SAE's labels: ``replace`` drops every label it had first, ``merge`` only those of the
        features given. One transaction; returns how many labels the SAE has now."""
        now = int(time.time())
        rows = [
            {
                "sae_id": sae_id,
                "feature": label.index,
                "label": label.text,
                "folded": label.text.casefold(),
                "explainer": label.explainer,
                "method": label.method,
                "score": label.score,
                "imported": now,
            }
            for label in labels
        ]
        with self.db.session() as session, session.begin():
            if session.get(SAERecord, sae_id) is None:
                raise SAENotFound(f"no SAE is registered as {sae_id!r}", param="sae_id")
            mine = LabelRecord.sae_id == sae_id
            if mode == "replace":
                session.execute(sa.delete(LabelRecord).where(mine))
            else:
                features = [row["feature"] for row in rows]
                for start in range(0, len(features), IN_CHUNK):
                    chunk = features[start : start + IN_CHUNK]
                    session.execute(sa.delete(LabelRecord).where(mine, LabelRecord.feature.in_(chunk)))
            if rows:
                session.execute(sa.insert(LabelRecord), rows)
            return session.scalar(sa.select(sa.func.count()).select_from(LabelRecord).where(mine)) or 0

    def delete_labels(self, sae_id: str) -> int:
        """Forget an SAE's labels; returns how many there were."""
        with self.db.session() as session, session.begin():
            if session.get(SAERecord, sae_id) is None:
                raise SAENotFound(f"no SAE is registered as {sae_id!r}", param="sae_id")
            done = session.execute(sa.delete(LabelRecord).where(LabelRecord.sae_id == sae_id))
            return int(getattr(done, "rowcount", 0) or 0)

    def label(self, sae_id: str, index: int) -> LabelRecord:
        with self.db.session() as session:
            if session.get(SAERecord, sae_id) is None:
                raise SAENotFound(f"no SAE is registered as {sae_id!r}", param="sae_id")
            record = session.get(LabelRecord, (sae_id, index))
        if record is None:
            raise LabelNotFound(f"feature {index} of SAE {sae_id!r} has no label", param="index")
        return record

    def search_labels(
        self, sae_id: str, text: str | None, limit: int, after: int | None
    ) -> tuple[list[LabelRecord], bool]:
        """An SAE's labels in feature order, those holding ``text`` (case-insensitive) when given, after
        the feature ``after``: one page and whether more follow."""
        query = sa.select(LabelRecord).where(LabelRecord.sae_id == sae_id).order_by(LabelRecord.feature)
        if text:
            query = query.where(LabelRecord.folded.contains(text.casefold(), autoescape=True))
        if after is not None:
            query = query.where(LabelRecord.feature > after)
        with self.db.session() as session:
            if session.get(SAERecord, sae_id) is None:
                raise SAENotFound(f"no SAE is registered as {sae_id!r}", param="sae_id")
            rows = list(session.scalars(query.limit(limit + 1)))
        return rows[:limit], len(rows) > limit

    def label_counts(self, sae_id: str | None = None) -> dict[str, int]:
        """How many labels each SAE (or only ``sae_id``) has; SAEs without any left out."""
        query = sa.select(LabelRecord.sae_id, sa.func.count()).group_by(LabelRecord.sae_id)
        if sae_id is not None:
            query = query.where(LabelRecord.sae_id == sae_id)
        with self.db.session() as session:
            return {sae: int(n) for sae, n in session.execute(query)}

    def labels_for(self, wanted: Mapping[str, Iterable[int]]) -> dict[str, dict[int, str]]:
        """The labels of the given features, per SAE (features without one left out)."""
        found: dict[str, dict[int, str]] = {}
        with self.db.session() as session:
            for sae_id, indices in wanted.items():
                features = sorted(set(indices))
                mine = found.setdefault(sae_id, {})
                for start in range(0, len(features), IN_CHUNK):
                    chunk = features[start : start + IN_CHUNK]
                    rows = session.execute(
                        sa.select(LabelRecord.feature, LabelRecord.label).where(
                            LabelRecord.sae_id == sae_id, LabelRecord.feature.in_(chunk)
                        )
                    )
                    mine.update({int(feature): label for feature, label in rows})
        return found

    def all_labels(self, sae_id: str) -> dict[int, str]:
        """Every label of an SAE (for the activations' cache)."""
        with self.db.session() as session:
            rows = session.execute(
                sa.select(LabelRecord.feature, LabelRecord.label).where(LabelRecord.sae_id == sae_id)
            )
            return {int(feature): label for feature, label in rows}


def label_json(record: LabelRecord) -> dict[str, Any]:
    """A label as the API shows it."""
    return {
        "sae_id": record.sae_id,
        "index": record.feature,
        "label": record.label,
        "explainer": record.explainer,
        "method": record.method,
        "score": record.score,
        "imported": record.imported,
    }
