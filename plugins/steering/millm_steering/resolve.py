"""What a request applies: from the state and the request's own fields to applied entries.

An ``Entry`` is one feature set applied at one attachment: the request's
profile, an inline set, the active profile, the live (manual) values, or one
member of an active circuit (or its slice fallback). Entries with nothing left to
apply (every value zero) are dropped, so "nothing applied" is always an empty list.

Active circuits claim the attachments they serve (live values there are not
applied); the base (the request's profile, else the active profile, else the live
values) applies beside them, each scaled by its own λ (``intensity.Dialing``).
An inline set replaces both, and is built by ``inline_entries`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from millm_host.api import InvalidParameter

from .errors import SAENotAttached
from .features import Features, check_indices
from .hashing import AppliedSet, applied_set, steering_hash
from .intensity import Dialing
from .state import ActiveCircuit, Attachment, AttachmentKey, Profile, Snapshot

#: The ``unknown`` reason when an active circuit's definition cannot be read against the attached SAEs.
CLAIMS_UNREADABLE = "claims_unreadable"


@dataclass(frozen=True)
class Entry:
    """One applied feature set. ``kind`` is ``profile``, ``inline``, ``manual`` or ``circuit``."""

    kind: str
    attachment: Attachment
    applied: AppliedSet
    name: str | None = None
    source: str | None = None  # profile entries: request | active
    intensity: float | None = None  # profile and circuit entries: the effective λ
    owner: str = "base"  # "circuit:<id>" for what a circuit serves (its members or its fallback)
    circuit_id: str | None = None  # circuit entries
    rung: int | None = None  # circuit entries

    @property
    def key(self) -> AttachmentKey:
        return self.attachment.key

    @property
    def slot(self) -> tuple[str, str, int]:
        """One write hook per owner and attachment: a circuit member beside a profile on one SAE adds."""
        return (self.owner, *self.attachment.key)

    @property
    def hash(self) -> str:
        return steering_hash(self.attachment.sae_id, self.applied.values)


def _kept(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.applied.values]


def profile_entries(snap: Snapshot, profile: Profile, lam: float, source: str) -> list[Entry]:
    """The profile scaled by λ on its attachment (nothing if its SAE is not attached there)."""
    attachment = snap.attachments.get(profile.key)
    if attachment is None or lam == 0.0:
        return []
    return _kept(
        [
            Entry(
                "profile",
                attachment,
                applied_set(profile.features, lam),
                name=profile.name,
                source=source,
                intensity=lam,
            )
        ]
    )


def profile_lam(profile: Profile, dialing: Dialing) -> float:
    """λ of a profile under the cluster rule (a plain profile: no range, stored λ 1)."""
    return dialing.cluster(profile.intensity_range, profile.dial)


def global_entries(snap: Snapshot, dialing: Dialing, claimed: frozenset[AttachmentKey] = frozenset()) -> list[Entry]:
    """The base of a request with no profile or inline set: per attachment, the active
    profile where it claims it, else the live values unless a circuit claims it."""
    entries = []
    for attachment in snap.attached():
        if snap.active is not None and snap.active.key == attachment.key:
            entries += profile_entries(snap, snap.active, profile_lam(snap.active, dialing), "active")
        elif snap.manual.get(attachment.key) and attachment.key not in claimed:
            lam = dialing.plain()
            if lam != 0.0:
                entries.append(Entry("manual", attachment, applied_set(snap.manual[attachment.key], lam)))
    return _kept(entries)


@dataclass(frozen=True)
class Served:
    """What a request applies, and why its header cannot say so when it cannot (an ``unknown`` reason)."""

    entries: list[Entry] = field(default_factory=list)
    problem: str | None = None


def _readable(features: Features, attachment: Attachment) -> bool:
    return all(index < attachment.sae.cfg.d_sae for index, _ in features)


def circuit_entries(
    snap: Snapshot, active: ActiveCircuit, dialing: Dialing
) -> tuple[list[Entry], set[AttachmentKey], bool]:
    """One active circuit: its entries, the attachments it claims, and whether it could be read.

    Every member's SAE attached: the circuit serves (circuit rule). Some missing and the
    fallback cluster's SAE attached: the fallback serves, as a profile (cluster rule).
    Otherwise the members that are attached serve; none attached, nothing.
    """
    doc, owner = active.doc, f"circuit:{active.circuit_id}"
    served = [(m, snap.attachments[m.key]) for m in doc.members if m.key in snap.attachments]
    fallback = doc.fallback
    if len(served) < len(doc.members) and fallback is not None:
        backing = snap.attachments.get((fallback.sae_id, fallback.layer))
        if backing is not None:
            if not _readable(fallback.features, backing):
                return [], set(), False
            lam = dialing.cluster(fallback.intensity_range, active.dial)
            applied = applied_set(fallback.features, lam) if lam != 0.0 else applied_set(())
            entry = Entry("profile", backing, applied, fallback.name, "active", lam, owner)
            return [entry], {backing.key}, True
    if any(not _readable(m.features, a) for m, a in served):
        return [], set(), False
    lam = dialing.circuit(doc.intensity_range, active.dial)
    entries = [
        Entry(
            "circuit",
            a,
            applied_set(m.features, lam) if lam != 0.0 else applied_set(()),
            intensity=lam,
            owner=owner,
            circuit_id=doc.circuit_id,
            rung=doc.rung,
        )
        for m, a in served
    ]
    return entries, {a.key for _, a in served}, True


def serve(snap: Snapshot, dialing: Dialing, profile: Profile | None = None) -> Served:
    """Everything but an inline set: the active circuits (by id), then the base.

    The base is ``profile`` (the request's own) if given, else the active profile and live values.
    """
    entries: list[Entry] = []
    claimed: set[AttachmentKey] = set()
    problem = None
    for circuit_id in sorted(snap.circuits):
        found, claims, readable = circuit_entries(snap, snap.circuits[circuit_id], dialing)
        if not readable:
            problem = CLAIMS_UNREADABLE
        entries += found
        claimed |= claims
    if profile is not None:
        entries += profile_entries(snap, profile, profile_lam(profile, dialing), "request")
    else:
        entries += global_entries(snap, dialing, frozenset(claimed))
    return Served(_kept(entries), problem)


def inline_entries(attachment: Attachment, features: Features) -> list[Entry]:
    return _kept([Entry("inline", attachment, applied_set(features))])


def describe(attachments: list[Attachment]) -> str:
    return ", ".join(f"({a.sae_id}, layer {a.layer})" for a in attachments) or "none"


def select_attachment(snap: Snapshot, sae_id: str | None, layer: int | None, where: str) -> Attachment:
    """The attachment a request names by ``sae_id`` (and ``layer``), or the only one.

    400 ``SAE_NOT_ATTACHED`` when nothing matches; 400 naming each candidate
    ``(sae_id, layer)`` when the choice is ambiguous. ``where`` is the object
    holding ``sae_id`` (``"steering"``; ``""`` for a top-level field).
    """
    sae_param = f"{where}.sae_id" if where else "sae_id"
    attached = snap.attached()
    candidates = [a for a in attached if (sae_id is None or a.sae_id == sae_id) and (layer is None or a.layer == layer)]
    if not candidates:
        wanted = "an SAE" if sae_id is None else f"SAE {sae_id!r}"
        where = "" if layer is None else f" at layer {layer}"
        raise SAENotAttached(
            f"{wanted} is not attached{where} to the resident model (attached: {describe(attached)})",
            param=sae_param if sae_id is not None or not where else where,
        )
    if len(candidates) > 1:
        raise InvalidParameter(
            f"{len(candidates)} SAE attachments match; name one with sae_id (and layer): {describe(candidates)}",
            param=sae_param,
        )
    return candidates[0]


def check_profile(snap: Snapshot, profile: Profile) -> None:
    """Refuse a profile the attached SAEs cannot serve (with none attached it runs unsteered)."""
    if not snap.attachments:
        return
    attachment = snap.attachments.get(profile.key)
    if attachment is None:
        raise SAENotAttached(
            f"profile {profile.name!r} steers SAE {profile.sae_id!r} at layer {profile.layer}, which is not "
            f"attached (attached: {describe(snap.attached())})",
            param="profile",
        )
    check_indices([i for i, _ in profile.features], attachment.sae.cfg.d_sae, profile.sae_id, lambda j: "profile")
