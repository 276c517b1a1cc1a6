"""What a request applies: from the state and the request's own fields to applied entries.

An ``Entry`` is one feature set applied at one attachment: the request's
profile, an inline set, the active profile or the live (manual) values. Entries
with nothing left to apply (every value zero) are dropped, so "nothing applied"
is always an empty list.
"""

from __future__ import annotations

from dataclasses import dataclass

from millm_host.api import InvalidParameter

from .errors import SAENotAttached
from .features import Features, check_indices
from .hashing import AppliedSet, applied_set, steering_hash
from .state import Attachment, AttachmentKey, Profile, Snapshot


@dataclass(frozen=True)
class Entry:
    """One applied feature set. ``kind`` is ``profile``, ``inline`` or ``manual``."""

    kind: str
    attachment: Attachment
    applied: AppliedSet
    name: str | None = None
    source: str | None = None  # profile entries: request | active
    intensity: float | None = None  # profile entries: the effective λ

    @property
    def key(self) -> AttachmentKey:
        return self.attachment.key

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


def global_entries(snap: Snapshot, lam: float) -> list[Entry]:
    """What a request with no profile or inline set gets: per attachment, the active
    profile where it claims it, else the live values; every one scaled by λ."""
    if lam == 0.0:
        return []
    entries = []
    for attachment in snap.attached():
        if snap.active is not None and snap.active.key == attachment.key:
            entries += profile_entries(snap, snap.active, lam, "active")
        elif snap.manual.get(attachment.key):
            entries.append(Entry("manual", attachment, applied_set(snap.manual[attachment.key], lam)))
    return _kept(entries)


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
