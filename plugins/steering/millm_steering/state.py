"""The server's live steering state: attached SAEs, live values, the active profile, the epoch.

Management routes change it (on the event loop); requests read a consistent
``Snapshot`` of it (validation threads, the engine thread). Every change moves
the epoch, so a request can tell that the state changed while it generated.
Nothing here touches model weights: steering is applied by per-request hooks.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from .documents import CircuitDoc
from .features import Features

if TYPE_CHECKING:
    from millm_host.api import HookPointName

    from .sae import LoadedSAE

AttachmentKey = tuple[str, int]  # (sae_id, layer)


@dataclass(frozen=True)
class Attachment:
    """An SAE attached to the resident model at one layer (its own hook point kind)."""

    sae: LoadedSAE
    layer: int
    point: HookPointName

    @property
    def sae_id(self) -> str:
        return self.sae.sae_id

    @property
    def key(self) -> AttachmentKey:
        return (self.sae.sae_id, self.layer)

    @property
    def hook_name(self) -> str:
        return f"blocks.{self.layer}.hook_{self.point}"


@dataclass(frozen=True)
class Profile:
    """A saved profile as steering applies it; an imported cluster is one with its range and stored dial."""

    name: str
    sae_id: str
    layer: int
    features: Features
    cluster_id: str | None = None
    intensity_range: tuple[float, float] | None = None
    dial: float = 1.0  # a cluster's persistent λ

    @property
    def key(self) -> AttachmentKey:
        return (self.sae_id, self.layer)


@dataclass(frozen=True)
class ActiveCircuit:
    """An activated circuit and its persistent dial."""

    doc: CircuitDoc
    dial: float = 1.0

    @property
    def circuit_id(self) -> str:
        return self.doc.circuit_id


@dataclass(frozen=True)
class Snapshot:
    """A consistent view of the state at one epoch."""

    epoch: int
    attachments: Mapping[AttachmentKey, Attachment]
    manual: Mapping[AttachmentKey, Features]
    active: Profile | None
    model_load_id: str | None
    circuits: Mapping[str, ActiveCircuit] = field(default_factory=lambda: MappingProxyType({}))

    def attached(self, sae_id: str | None = None) -> list[Attachment]:
        """Attachments (of ``sae_id`` when given), ordered by layer then SAE id."""
        found = [a for a in self.attachments.values() if sae_id is None or a.sae_id == sae_id]
        return sorted(found, key=lambda a: (a.layer, a.sae_id))

    def live_manual(self, key: AttachmentKey) -> bool:
        """Whether the live values on ``key`` are what a plain request gets (attached, not claimed)."""
        claimed = self.active is not None and self.active.key == key
        return key in self.attachments and bool(self.manual.get(key)) and not claimed


class SteeringState:
    """Thread-safe live state. Each mutator moves the epoch by one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0
        self._attachments: dict[AttachmentKey, Attachment] = {}
        self._manual: dict[AttachmentKey, Features] = {}
        self._active: Profile | None = None
        self._circuits: dict[str, ActiveCircuit] = {}
        self._model_load_id: str | None = None
        self._snapshot = self._take()

    @property
    def epoch(self) -> int:
        """Read without the lock: an int read is atomic, and hooks read it per forward pass."""
        return self._epoch

    def snapshot(self) -> Snapshot:
        return self._snapshot

    def _take(self) -> Snapshot:
        return Snapshot(
            epoch=self._epoch,
            attachments=MappingProxyType(dict(self._attachments)),
            manual=MappingProxyType(dict(self._manual)),
            active=self._active,
            model_load_id=self._model_load_id,
            circuits=MappingProxyType(dict(self._circuits)),
        )

    def _commit(self) -> Snapshot:
        self._epoch += 1
        self._snapshot = self._take()
        return self._snapshot

    # --- management changes (each moves the epoch) -------------------------------------
    def touch(self) -> Snapshot:
        """A management change that leaves the steering values as they are (a registration)."""
        with self._lock:
            return self._commit()

    def attach(self, attachment: Attachment, load_id: str) -> Snapshot | None:
        """Attach to the model loaded as ``load_id``; None if that model is no longer resident."""
        with self._lock:
            if load_id != self._model_load_id:
                return None
            self._attachments[attachment.key] = attachment
            return self._commit()

    def detach(self, keys: list[AttachmentKey]) -> Snapshot:
        with self._lock:
            for key in keys:
                self._attachments.pop(key, None)
                self._manual.pop(key, None)
            return self._commit()

    def set_manual(self, key: AttachmentKey, features: Features) -> Snapshot:
        with self._lock:
            if features:
                self._manual[key] = features
            else:
                self._manual.pop(key, None)
            return self._commit()

    def clear_manual(self) -> Snapshot:
        with self._lock:
            self._manual.clear()
            return self._commit()

    def activate(self, profile: Profile | None) -> Snapshot:
        with self._lock:
            self._active = profile
            return self._commit()

    def set_circuit(self, circuit_id: str, active: ActiveCircuit | None) -> Snapshot:
        """Activate (or refresh) a circuit; None deactivates it."""
        with self._lock:
            if active is None:
                self._circuits.pop(circuit_id, None)
            else:
                self._circuits[circuit_id] = active
            return self._commit()

    def profile_deleted(self, name: str) -> Snapshot:
        with self._lock:
            if self._active is not None and self._active.name == name:
                self._active = None
            return self._commit()

    def model_loaded(self, load_id: str) -> Snapshot:
        with self._lock:
            self._model_load_id = load_id
            return self._commit()

    def model_unloading(self) -> Snapshot:
        """The resident model goes: its attachments and their live values go with it."""
        with self._lock:
            self._model_load_id = None
            self._attachments.clear()
            self._manual.clear()
            return self._commit()
