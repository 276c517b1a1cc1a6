"""This process's rule sets converge to the database (gunicorn's workers, replicas on one database).

The stored sets and attachments are the desired state: an import, attach, detach
or delete on any process writes them, and changes that process at once. Each
convergence pass (``MILLM_CONVERGE_INTERVAL_S``) here reads which sets and
attachments the database holds, proves and compiles the sets this process lacks
(their cases run under this build, as at startup), forgets the deleted ones, and
takes the attachments as stored. A set whose cases fail under this build is kept
and reported, not evaluated, as at startup.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from . import store
from .runtime import VECTORS_FAILED, prove

if TYPE_CHECKING:
    from .runtime import Runtime


class Converger:
    """The rulesets plugin's converger (``add_converger``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def __call__(self) -> list[str]:
        return await asyncio.to_thread(self.converge)

    def converge(self) -> list[str]:
        """One pass (a worker thread): under the runtime's lock, so a change this process makes meanwhile
        is either read here or made after; the reasons this process differs."""
        runtime, db = self.runtime, self.runtime.host.db
        with runtime.lock:
            stored = set(store.ids(db))
            for gone in set(runtime.sets) - stored:
                runtime.drop(gone)
            for rule_set_id in sorted(stored - set(runtime.sets)):  # imported elsewhere
                runtime.put(prove(store.get(db, rule_set_id), runtime.code_caller()))
            attached = store.attachments(db)
            if attached != runtime.attached:
                runtime.attached = attached
        return [
            f"rule set {loaded.id} ({loaded.ruleset_id} v{loaded.version}): its cases fail under this build, "
            "so it is not evaluated here"
            for loaded in runtime.sets.values()
            if loaded.status == VECTORS_FAILED and runtime.attached_to(loaded.id)
        ]
