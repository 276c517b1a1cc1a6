"""This replica's steering converges to the desired state in the database (desired.py).

Each pass re-reads the steering lock, then, when the stored revision is one this
replica has not reached, brings its live state there: detaches what is no longer
wanted, attaches the rest through ``SteeringService.attach`` (its own model's
checks), sets the live values, the active profile and circuits with their dials.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from millm_host.api import MillmError, converge_soon

from . import desired
from .documents import read_circuit
from .state import ActiveCircuit

if TYPE_CHECKING:
    from .service import SteeringService


class Converger:
    """The steering plugin's converger (``add_converger``), and the catch-up before a local change."""

    def __init__(self, service: SteeringService) -> None:
        self.service = service
        self.applied = 0  # the desired revision this replica last reached (or wrote)
        self.reasons: list[str] = []
        self._lock = asyncio.Lock()

    async def __call__(self) -> list[str]:
        service = self.service
        service.locked_model = await asyncio.to_thread(service.store.lock)
        async with self._lock:  # read under the lock: a local change publishes under it
            revision, document = await asyncio.to_thread(desired.read, service.host.db)
            if document is None or (revision == self.applied and not self.reasons):
                return []
            if document != desired.document_of(service.state.snapshot()):
                self.reasons = await self._apply(document)
            else:
                self.reasons = []
            self.applied = revision
            return list(self.reasons)

    async def catch_up(self) -> None:
        """Before a local change: reach the stored revision first, so the change does not undo another's."""
        revision, _ = await asyncio.to_thread(desired.read, self.service.host.db)
        if revision != self.applied:
            await self()

    async def publish(self) -> None:
        """After a local change: store the live state as the desired state."""
        document = desired.document_of(self.service.state.snapshot())
        async with self._lock:
            self.applied = await asyncio.to_thread(desired.write, self.service.host.db, document)
            self.reasons = []
        converge_soon(self.service.host)

    async def _apply(self, document: dict[str, Any]) -> list[str]:
        service, state = self.service, self.service.state
        reasons: list[str] = []
        snap = state.snapshot()
        attached = {(sae_id, layer) for sae_id, layer in document["attached"]}
        extra = [key for key in snap.attachments if key not in attached]
        if extra:
            state.detach(extra)
        for sae_id, layer in sorted(attached - set(snap.attachments)):
            try:
                await service.attach(sae_id, layer)
            except MillmError as exc:
                reasons.append(f"steering: SAE {sae_id} at layer {layer}: {exc.message}")
        snap = state.snapshot()
        manual = {(s, layer): tuple((int(i), float(v)) for i, v in f) for s, layer, f in document["manual"]}
        for key in set(snap.manual) - manual.keys():
            state.set_manual(key, ())
        for key, features in manual.items():
            if key in snap.attachments and snap.manual.get(key) != features:
                state.set_manual(key, features)
        reasons += await self._profile(document["active"])
        reasons += await self._circuits(dict(document["circuits"]))
        return reasons

    async def _profile(self, active: list[Any] | None) -> list[str]:
        state = self.service.state
        current = state.snapshot().active
        if active is None:
            if current is not None:
                state.activate(None)
            return []
        if current is not None and [current.name, current.dial] == active:
            return []
        try:
            profile = await asyncio.to_thread(self.service.store.load_profile, active[0])
        except MillmError as exc:
            return [f"steering: profile {active[0]}: {exc.message}"]
        if profile != current:
            state.activate(profile)
        return []

    async def _circuits(self, wanted: dict[str, float]) -> list[str]:
        state = self.service.state
        reasons = []
        current = state.snapshot().circuits
        for circuit_id in set(current) - wanted.keys():
            state.set_circuit(circuit_id, None)
        for circuit_id, dial in wanted.items():
            if circuit_id in current and current[circuit_id].dial == dial:
                continue
            try:
                record = await asyncio.to_thread(self.service.store.circuit, circuit_id)
            except MillmError as exc:
                reasons.append(f"steering: circuit {circuit_id}: {exc.message}")
                continue
            state.set_circuit(circuit_id, ActiveCircuit(read_circuit(record.document), record.intensity))
        return reasons
