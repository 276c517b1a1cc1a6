"""Each SAE's labels in memory, for ``return_sae_activations``: a response looks its features up in a
dict, never in the database.

Filled at validation (a worker thread that may use the database), only for SAEs whose activations
are asked for; forgotten on this server's imports and deletes, and read again after ``TTL`` seconds,
so another replica's import reaches this one's activations within that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store import Store

#: Seconds a cached SAE's labels are served before they are read again.
TTL = 30.0
EMPTY: Mapping[int, str] = {}


class LabelCache:
    """SAE id → its labels (feature index → label), read from the store on demand."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._entries: dict[str, tuple[float, Mapping[int, str]]] = {}
        self._lock = threading.Lock()

    def warm(self, sae_id: str) -> None:
        """Read the SAE's labels unless they are fresh (blocking: off the event loop)."""
        entry = self._entries.get(sae_id)
        if entry is not None and time.monotonic() - entry[0] < TTL:
            return
        labels = self.store.all_labels(sae_id)
        with self._lock:
            self._entries[sae_id] = (time.monotonic(), labels)

    def get(self, sae_id: str) -> Mapping[int, str]:
        """The labels last read (empty when never read): no database."""
        entry = self._entries.get(sae_id)
        return EMPTY if entry is None else entry[1]

    def forget(self, sae_id: str) -> None:
        with self._lock:
            self._entries.pop(sae_id, None)
