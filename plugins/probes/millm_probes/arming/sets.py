"""Behaviour sets: every imported probe naming one behaviour key (one version at a time) is that behaviour's set.

Nothing stores a set; it is read from the imported probes. Each result of a
behaviour carries a ``set`` block saying how many of its set's members produced
results beside it, so an application knows whether its blend's inputs were all there.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Member:
    """One imported probe as its behaviour's set sees it."""

    probe_id: str
    name: str
    behaviour: str
    version: str | None
    detector_digest: str


Members = Mapping[str, tuple[Member, ...]]  # behaviour key -> its probes (every version), in import order


def members_of(rows: Iterable[Any]) -> dict[str, tuple[Member, ...]]:
    """The behaviour sets of imported probe rows (a probe naming no behaviour is in none)."""
    sets: dict[str, list[Member]] = {}
    for row in rows:
        if row.behaviour is not None:
            sets.setdefault(row.behaviour, []).append(
                Member(row.id, row.name, row.behaviour, row.version, row.detector_digest)
            )
    return {key: tuple(value) for key, value in sets.items()}


def same_version(members: Members, behaviour: str, version: str | None) -> tuple[Member, ...]:
    return tuple(m for m in members.get(behaviour, ()) if m.version == version)


def members_digest(members: Iterable[Member]) -> str:
    """Which probes make the set: a digest of their ids and detectors (changes when a member is added)."""
    listed = sorted([m.probe_id, m.detector_digest] for m in members)
    data = json.dumps(listed, separators=(",", ":")).encode("utf-8")
    return "sha256:" + hashlib.sha256(data).hexdigest()


def set_block(members: tuple[Member, ...], present: set[str]) -> dict[str, Any]:
    """The ``set`` block: of ``members``, those in ``present`` (armed live; scored statelessly)."""
    missing = [m.probe_id for m in members if m.probe_id not in present]
    return {
        "armed_members": len(members) - len(missing),
        "total_members": len(members),
        "complete": not missing,
        "missing_probe_ids": missing,
        "members_digest": members_digest(members),
    }


def blocks_for(views: Iterable[Any], members: Members) -> dict[str, dict[str, Any]]:
    """probe id -> its set block, for a group of probes producing results together (``views``).

    One block per (behaviour, version) set, shared by its members' results: a set of thousands is
    counted and digested once, not once per member."""
    views = list(views)
    present = {v.probe_id for v in views}
    shared: dict[tuple[str, str | None], tuple[set[str], dict[str, Any]]] = {}
    blocks = {}
    for view in views:
        if view.behaviour is None:
            continue
        key = (view.behaviour, view.version)
        if key not in shared:
            group = same_version(members, view.behaviour, view.version)
            shared[key] = ({m.probe_id for m in group}, set_block(group, present))
        ids, block = shared[key]
        if view.probe_id not in ids:  # deleted meanwhile: a set of itself
            single = (Member(view.probe_id, view.name, view.behaviour, view.version, view.detector_digest),)
            blocks[view.probe_id] = set_block(single, present)
        else:
            blocks[view.probe_id] = block
    return blocks


def state_label(armed: int, total: int) -> str:
    """``armed``, ``disarmed`` or ``partial: 3 of 4 armed``."""
    if armed == 0:
        return "disarmed"
    if armed == total:
        return "armed"
    return f"partial: {armed} of {total} armed"
