"""Imported clusters and circuits: import, views, activation and their persistent dials.

A cluster is served as a profile named by the cluster's ``name`` (so ``profile`` on a
request and profile activation reach it too), scaled by its dial under the cluster
rule. Circuits are activated beside the active profile; several may be active.
Documents are stored as received and re-exported byte for byte equal as JSON.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from millm_host.api import InvalidParameter

from .documents import RUNG_LANGUAGE, read_circuit, read_cluster
from .features import check_indices, features_json
from .header import rung_value
from .intensity import Dialing, bounds
from .resolve import circuit_entries
from .state import ActiveCircuit, Snapshot
from .store import to_profile

if TYPE_CHECKING:
    from .service import SteeringService
    from .tables import CircuitRecord, ClusterRecord, ProfileRecord

#: Names the circuit routes use for themselves.
RESERVED_CIRCUIT_IDS = frozenset({"active"})


def _dial_value(value: Any, high: float) -> float:
    """A stored dial: a number in [0, high] (the management bounds)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= high:
        raise InvalidParameter(f"intensity must be a number from 0 to {high!r}, not {value!r}", param="intensity")
    return float(value)


class Catalog:
    """What the ``/api/clusters`` and ``/api/circuits`` routes do."""

    def __init__(self, service: SteeringService) -> None:
        self.service = service
        self.store = service.store
        self.state = service.state

    # --- clusters -------------------------------------------------------------------------
    def _cluster_high(self, record: ClusterRecord) -> float:
        limits = self.service.limits()
        return bounds(read_cluster(record.document).intensity_range, limits.cluster_min, limits.cluster_max)[1]

    def cluster_view(self, record: ClusterRecord, profile: ProfileRecord, snap: Snapshot) -> dict[str, Any]:
        doc = read_cluster(record.document)
        active = snap.active is not None and snap.active.cluster_id == record.cluster_id
        return {
            "cluster_id": record.cluster_id,
            "name": doc.name,
            "profile": profile.name,
            "sae_id": doc.sae_id,
            "layer": doc.layer,
            "features": features_json(doc.features),
            "intensity_range": None if doc.intensity_range is None else list(doc.intensity_range),
            "intensity": record.intensity,
            "intensity_bounds": [0.0, self._cluster_high(record)],
            "active": active,
            "live": active and (doc.sae_id, doc.layer) in snap.attachments,
            "created": record.created,
        }

    async def import_cluster(self, document: Any) -> dict[str, Any]:
        doc = read_cluster(document)
        sae = await asyncio.to_thread(self.store.sae, doc.sae_id)
        check_indices([i for i, _ in doc.features], sae.d_sae, doc.sae_id, lambda j: f"features[{j}].index")
        record, profile = await asyncio.to_thread(self.store.add_cluster, document, doc)
        return await self._labelled(self.cluster_view(record, profile, self.state.touch()))

    async def _labelled(self, view: dict[str, Any]) -> dict[str, Any]:
        """A cluster's view with its features' labels."""
        return (await self.service.with_labels([view]))[0]

    async def list_clusters(self) -> list[dict[str, Any]]:
        rows = await asyncio.to_thread(self.store.clusters)
        snap = self.state.snapshot()
        return await self.service.with_labels([self.cluster_view(c, p, snap) for c, p in rows])

    async def get_cluster(self, cluster_id: str) -> dict[str, Any]:
        record, profile = await asyncio.to_thread(self.store.cluster, cluster_id)
        return await self._labelled(self.cluster_view(record, profile, self.state.snapshot()))

    async def export_cluster(self, cluster_id: str) -> Any:
        record, _ = await asyncio.to_thread(self.store.cluster, cluster_id)
        return record.document

    async def delete_cluster(self, cluster_id: str) -> None:
        name = await asyncio.to_thread(self.store.delete_cluster, cluster_id)
        self.state.profile_deleted(name)

    async def activate_cluster(self, cluster_id: str) -> dict[str, Any]:
        record, profile = await asyncio.to_thread(self.store.cluster, cluster_id)
        snap = self.state.activate(to_profile(profile, record))
        return await self._labelled({**self.cluster_view(record, profile, snap), "epoch": snap.epoch})

    async def deactivate_cluster(self, cluster_id: str) -> dict[str, Any]:
        record, profile = await asyncio.to_thread(self.store.cluster, cluster_id)
        snap = self.state.snapshot()
        if snap.active is not None and snap.active.cluster_id == cluster_id:
            snap = self.state.activate(None)
        return await self._labelled({**self.cluster_view(record, profile, snap), "epoch": snap.epoch})

    async def set_cluster_intensity(self, cluster_id: str, value: Any) -> dict[str, Any]:
        """Set the persistent dial (bounds [0, max]); an active cluster picks it up at once."""
        record, profile = await asyncio.to_thread(self.store.cluster, cluster_id)
        intensity = _dial_value(value, self._cluster_high(record))
        await asyncio.to_thread(self.store.set_cluster_intensity, cluster_id, intensity)
        record.intensity = intensity
        snap = self.state.snapshot()
        if snap.active is not None and snap.active.cluster_id == cluster_id:
            snap = self.state.activate(to_profile(profile, record))
        else:
            snap = self.state.touch()
        return await self._labelled({**self.cluster_view(record, profile, snap), "epoch": snap.epoch})

    # --- circuits -------------------------------------------------------------------------
    def _circuit_high(self, record: CircuitRecord) -> float:
        limits = self.service.limits()
        return bounds(read_circuit(record.document).intensity_range, limits.circuit_min, limits.circuit_max)[1]

    def circuit_view(self, record: CircuitRecord, snap: Snapshot) -> dict[str, Any]:
        doc = read_circuit(record.document)
        return {
            "circuit_id": doc.circuit_id,
            "name": doc.name,
            "rung": doc.rung,
            "language": RUNG_LANGUAGE[doc.rung],
            "intensity_range": None if doc.intensity_range is None else list(doc.intensity_range),
            "intensity": record.intensity,
            "intensity_bounds": [0.0, self._circuit_high(record)],
            "members": [
                {"sae_id": m.sae_id, "layer": m.layer, "features": features_json(m.features)} for m in doc.members
            ],
            "slice_fallback": None if doc.fallback is None else {"cluster_id": doc.fallback.cluster_id},
            "active": doc.circuit_id in snap.circuits,
            "created": record.created,
        }

    def steering_of(self, active: ActiveCircuit, snap: Snapshot) -> dict[str, Any]:
        """What the circuit really steers now, for a plain request (its stored dial)."""
        dialing = Dialing(None, self.service.limits())
        entries, _, readable = circuit_entries(snap, active, dialing)
        applied = [e for e in entries if e.applied.values]
        if not readable:
            mode, reason = "none", "unreadable"
        elif not entries:
            mode, reason = "none", "sae_not_attached"
        elif not applied:
            mode, reason = ("slice_fallback" if entries[0].kind == "profile" else "circuit"), "off"
        else:
            mode, reason = ("slice_fallback" if entries[0].kind == "profile" else "circuit"), None
        return {
            "mode": mode,
            "reason": reason,
            "intensity": entries[0].intensity if entries else None,
            "layers": [
                {"sae_id": e.attachment.sae_id, "layer": e.attachment.layer, "features": len(e.applied.values)}
                for e in applied
            ],
            "rung_header": rung_value(applied),
        }

    async def import_circuit(self, document: Any) -> dict[str, Any]:
        doc = read_circuit(document)
        if doc.circuit_id in RESERVED_CIRCUIT_IDS:
            raise InvalidParameter(f"{doc.circuit_id!r} is reserved; choose another circuit_id", param="circuit_id")
        record = await asyncio.to_thread(self.store.add_circuit, doc.circuit_id, document)
        return self.circuit_view(record, self.state.touch())

    async def list_circuits(self) -> list[dict[str, Any]]:
        records = await asyncio.to_thread(self.store.circuits)
        snap = self.state.snapshot()
        views = [self.circuit_view(r, snap) for r in records]
        await self.service.with_labels([m for v in views for m in v["members"]])
        return views

    async def get_circuit(self, circuit_id: str) -> dict[str, Any]:
        record = await asyncio.to_thread(self.store.circuit, circuit_id)
        view = self.circuit_view(record, self.state.snapshot())
        await self.service.with_labels(view["members"])
        return view

    async def export_circuit(self, circuit_id: str) -> Any:
        return (await asyncio.to_thread(self.store.circuit, circuit_id)).document

    async def delete_circuit(self, circuit_id: str) -> None:
        await asyncio.to_thread(self.store.delete_circuit, circuit_id)
        self.state.set_circuit(circuit_id, None)

    async def activate_circuit(self, circuit_id: str) -> dict[str, Any]:
        record = await asyncio.to_thread(self.store.circuit, circuit_id)
        active = ActiveCircuit(read_circuit(record.document), record.intensity)
        snap = self.state.set_circuit(circuit_id, active)
        return {**self.circuit_view(record, snap), "steering": self.steering_of(active, snap), "epoch": snap.epoch}

    async def deactivate_circuit(self, circuit_id: str) -> dict[str, Any]:
        record = await asyncio.to_thread(self.store.circuit, circuit_id)
        snap = self.state.set_circuit(circuit_id, None)
        return {**self.circuit_view(record, snap), "epoch": snap.epoch}

    async def set_circuit_intensity(self, circuit_id: str, value: Any) -> dict[str, Any]:
        record = await asyncio.to_thread(self.store.circuit, circuit_id)
        intensity = _dial_value(value, self._circuit_high(record))
        record = await asyncio.to_thread(self.store.set_circuit_intensity, circuit_id, intensity)
        snap = self.state.snapshot()
        if circuit_id in snap.circuits:
            snap = self.state.set_circuit(circuit_id, ActiveCircuit(snap.circuits[circuit_id].doc, intensity))
        else:
            snap = self.state.touch()
        return {**self.circuit_view(record, snap), "epoch": snap.epoch}

    async def active_circuits(self) -> dict[str, Any]:
        """``GET /api/circuits/active``: each active circuit and what it really steers."""
        snap = self.state.snapshot()
        records = await asyncio.to_thread(self.store.circuits)
        by_id = {r.circuit_id: r for r in records}
        data = [
            {**self.circuit_view(by_id[cid], snap), "steering": self.steering_of(snap.circuits[cid], snap)}
            for cid in sorted(snap.circuits)
            if cid in by_id
        ]
        await self.service.with_labels([m for v in data for m in v["members"]])
        return {"object": "list", "data": data, "epoch": snap.epoch}
