"""Live steering as desired state in the database (several replicas, one database).

Every management change on a replica writes the whole live state (``document_of``)
to ``steering_desired`` with a new revision; every replica's converger brings its
own state there: it attaches SAEs (the same checks as ``/attach``, on its own
model), sets the live values, activates the profile and the circuits with their
dials. The steering lock is read from its own table each pass. A replica that
cannot follow (an SAE that does not fit its model) reports why.

Changes made at the same moment on two replicas: the later one wins whole (each
replica first catches up with the stored revision before it changes anything).
"""

from __future__ import annotations

from typing import Any

from .state import Snapshot
from .tables import DesiredRecord

ROW = 1


def document_of(snap: Snapshot) -> dict[str, Any]:
    """The live state as stored (JSON; sorted, so equal states compare equal)."""
    return {
        "attached": sorted([a.sae_id, a.layer] for a in snap.attachments.values()),
        "manual": sorted([key[0], key[1], [[i, s] for i, s in f]] for key, f in snap.manual.items() if f),
        "active": None if snap.active is None else [snap.active.name, snap.active.dial],
        "circuits": sorted([circuit_id, c.dial] for circuit_id, c in snap.circuits.items()),
    }


EMPTY: dict[str, Any] = {"attached": [], "manual": [], "active": None, "circuits": []}


def read(db: Any) -> tuple[int, dict[str, Any] | None]:
    """(revision, document); (0, None) before anything was stored."""
    with db.session() as session:
        record = session.get(DesiredRecord, ROW)
        return (0, None) if record is None else (record.revision, record.document)


def write(db: Any, document: dict[str, Any]) -> int:
    """Store ``document`` as the desired state; its revision (unchanged when it already is)."""
    with db.session() as session, session.begin():
        record = session.get(DesiredRecord, ROW, with_for_update=True)
        if record is None:
            session.add(DesiredRecord(id=ROW, revision=1, document=document))
            return 1
        if record.document != document:
            record.revision, record.document = record.revision + 1, document
        return record.revision
