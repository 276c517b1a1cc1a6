"""This replica's probes converge to the armed state in the database (several replicas, one database).

``probes.armed`` is the desired state: an operator's arm or disarm on any
replica writes it. Each pass here disarms what is no longer armed there, moves
the bar of what is armed here and was recalibrated elsewhere, and arms the
rest through the same gates as ``/arm`` (with the acknowledgement the operator
gave), on this replica's own model. A refusal is reported, and not retried until
the probe's bar or the resident model changes: parity is forward passes.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from millm_host.api import MillmError

from .. import store
from .manage import arm_here
from .sets import members_of

if TYPE_CHECKING:
    from ..runtime import Runtime
    from ..tables import Probe


class Converger:
    """The probes plugin's converger (``add_converger``)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        #: (probe id, bar revision, model load id) -> why arming was refused here
        self.refused: dict[tuple[str, int, str], str] = {}

    async def __call__(self) -> list[str]:
        runtime = self.runtime
        async with runtime.lock:  # read under the lock: an arm in progress here commits its row first
            states = await asyncio.to_thread(store.probe_states, runtime.host.db)  # a few bytes a probe
            desired = {row.id: row for row in states if row.armed}
            if members_of(states) != runtime.members:  # imported or deleted on another replica
                runtime.set_members(members_of(states))
            gone = set(runtime.snapshot.ids()) - desired.keys()
            if gone:
                runtime.disarm_many(gone)
            moved = [
                probe_id
                for probe_id, row in desired.items()
                if (entry := runtime.armed_entry(probe_id)) is not None
                and entry.view.decision_revision != row.decision_revision
            ]
            if moved:  # recalibrated on another replica
                for row in await asyncio.to_thread(store.find_probes, runtime.host.db, moved, strict=False):
                    runtime.update_view(await asyncio.to_thread(runtime.view, row))
        missing = [probe_id for probe_id in desired if runtime.armed_entry(probe_id) is None]
        if not missing:
            return []
        todo = await asyncio.to_thread(store.find_probes, runtime.host.db, missing, strict=False)
        engine = runtime.host.resident_engine()
        if engine is None:
            return [f"probe {row.id} ({row.name}): armed elsewhere; no model is loaded here" for row in todo]
        reasons = []
        for row in todo:
            key = (row.id, row.decision_revision, engine.info.load_id)
            reason = self.refused.get(key)
            if reason is None:
                reason, lasting = await self._arm(row)
                if lasting:  # a busy model (503) is tried again next pass
                    self.refused[key] = reason
            if reason:
                reasons.append(f"probe {row.id} ({row.name}): {reason}")
        return reasons

    async def _arm(self, row: Probe) -> tuple[str, bool]:
        """Arm ``row`` here through the gates: ('', True) when armed, else (why not, whether it lasts)."""
        runtime = self.runtime
        acknowledgements = await asyncio.to_thread(store.acknowledgements, runtime.host.db, row.id)
        acknowledgement = acknowledgements[-1]["text"] if acknowledgements else None
        try:
            async with runtime.lock:
                if runtime.armed_entry(row.id) is None:
                    await arm_here(runtime, row, acknowledgement, desired=False)
        except MillmError as exc:
            return f"refused here by {exc.code}: {exc.message}", exc.status < 500
        return "", True
