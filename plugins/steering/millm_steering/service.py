"""The steering service: the live state, the stored data and the management operations.

One per host, built at ``startup``. Management operations run on the event loop
and push blocking work (database, reading SAE files) to threads; every change
moves the steering epoch.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from millm_host.api import FieldNotHonoured, HookPoint, InvalidParameter, ModelBusy, check_display_name, confined_path
from millm_saelens import SAEUnreadable, describe as describe_sae_dir, read_config

from .errors import Conflict, SAENotAttached
from .features import Features, check_indices, features_json
from .header import steering_value, unknown_value
from .intensity import Dialing, Limits
from .label_cache import LabelCache
from .label_service import LabelService
from .resolve import select_attachment, serve
from .state import Attachment, Snapshot, SteeringState
from .store import Store, to_profile

if TYPE_CHECKING:
    from millm_host.api import Host

    from .converge import Converger
    from .sae import LoadedSAE
    from .tables import ProfileRecord, SAERecord

log = logging.getLogger("millm.steering")

#: SAE ids appear in URLs, in header strings (printable ASCII) and in the hashed canonical form (one line).
SAE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._~\-]{0,199}$")
#: Names the profile routes use for themselves.
RESERVED_PROFILE_NAMES = frozenset({"deactivate"})


class SteeringService:
    """Live state plus stored data, and what the management API does with them."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.state = SteeringState()
        self.store = Store(host.db)
        self.locked_model: str | None = self.store.lock()
        from .catalog import Catalog  # it imports this module's helpers

        self.catalog = Catalog(self)
        self.labels = LabelCache(self.store)
        self.labelling = LabelService(self)
        self.converger: Converger  # set at startup (plugin.py)

    def sae_dirs(self) -> list[Path]:
        """Where SAEs may be registered from (``MILLM_SAE_DIRS``, default ``<data dir>/saes``)."""
        settings = self.host.settings
        return [Path(d) for d in settings["MILLM_SAE_DIRS"] or [settings.data_dir / "saes"]]

    # --- shared with the request path -----------------------------------------------------
    def limits(self) -> Limits:
        """The intensity bounds of bases and circuits that declare no range."""
        return Limits.from_settings(self.host.settings)

    def is_resident(self, model_id: str) -> bool:
        return self.host.resident_engine() is not None and self.host.resident_model_id() == model_id

    # --- views ------------------------------------------------------------------------------
    def sae_view(self, record: SAERecord, snap: Snapshot, labels: int = 0) -> dict[str, Any]:
        return {
            "sae_id": record.sae_id,
            "path": record.path,
            "d_in": record.d_in,
            "d_sae": record.d_sae,
            "layer": record.layer,
            "hook_point": record.hook_point,
            "architecture": record.architecture,
            "k": record.cfg.get("k") if record.architecture == "topk" else None,
            "apply_b_dec_to_input": bool(record.cfg.get("apply_b_dec_to_input", False)),
            "model_name": record.cfg.get("model_name"),
            "created": record.created,
            "attached": [{"layer": a.layer, "hook_point": a.hook_name} for a in snap.attached(record.sae_id)],
            "labels": labels,
        }

    async def with_labels(self, views: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Views of feature sets (``sae_id``, ``features``), each feature with its label where known."""
        await self.labelling.annotate((v["sae_id"], v["features"]) for v in views)
        return views

    def profile_view(self, record: ProfileRecord, snap: Snapshot) -> dict[str, Any]:
        profile = to_profile(record, self.store.cluster_of(record.name))
        active = snap.active is not None and snap.active.name == profile.name
        return {
            "name": profile.name,
            "sae_id": profile.sae_id,
            "layer": profile.layer,
            "features": features_json(profile.features),
            "created": record.created,
            "active": active,
            "live": active and profile.key in snap.attachments,
            "cluster_id": profile.cluster_id,
        }

    def steering_view(self, snap: Snapshot) -> dict[str, Any]:
        """The whole live state, and the X-miLLM-Steering value a plain request would get now."""
        served = serve(snap, Dialing(None, self.limits()))
        claimed = {e.key for e in served.entries if e.owner != "base"}
        return {
            "epoch": snap.epoch,
            "model": self.host.resident_model_id(),
            "attached": [{"sae_id": a.sae_id, "layer": a.layer, "hook_point": a.hook_name} for a in snap.attached()],
            "active_profile": snap.active.name if snap.active else None,
            "active_profile_live": snap.active is not None and snap.active.key in snap.attachments,
            "manual": [self.manual_view(snap, key, claimed) for key in sorted(snap.manual, key=lambda k: (k[1], k[0]))],
            "active_circuits": sorted(snap.circuits),
            "applied": unknown_value(served.problem) if served.problem else steering_value(served.entries, False),
        }

    def manual_view(self, snap: Snapshot, key: tuple[str, int], claimed: set | None = None) -> dict[str, Any]:
        if claimed is None:
            served = serve(snap, Dialing(None, self.limits()))
            claimed = {e.key for e in served.entries if e.owner != "base"}
        live = snap.live_manual(key) and key not in claimed
        reason = None
        if key in claimed and snap.live_manual(key):
            reason = "claimed_by_circuit"
        elif not live:
            if key not in snap.attachments:
                reason = "sae_not_attached"
            elif not snap.manual.get(key):
                reason = "empty"
            else:
                reason = "claimed_by_active_profile"
        return {
            "sae_id": key[0],
            "layer": key[1],
            "features": features_json(snap.manual.get(key, ())),
            "live": live,
            "reason": reason,
        }

    # --- SAEs -------------------------------------------------------------------------------
    async def register_sae(self, path: str, sae_id: str | None) -> dict[str, Any]:
        """Register the SAELens directory ``path`` (inside ``MILLM_SAE_DIRS``) as ``sae_id``."""
        directory = confined_path(path, self.sae_dirs(), param="path", setting="MILLM_SAE_DIRS")
        sae_id = check_display_name(sae_id if sae_id is not None else directory.name, "sae_id")
        if not SAE_ID.match(sae_id):
            raise InvalidParameter(
                f"sae_id {sae_id!r} must be 1-200 characters of letters, digits and . _ ~ - (starting with a "
                "letter or digit)",
                param="sae_id",
            )

        def register() -> SAERecord:
            return self.store.add_sae(sae_id, directory, describe_sae_dir(directory))

        record = await asyncio.to_thread(register)
        log.info("registered SAE %s from %s", sae_id, directory)
        return self.sae_view(record, self.state.touch())

    async def list_saes(self) -> list[dict[str, Any]]:
        def read() -> tuple[list[SAERecord], dict[str, int]]:
            return self.store.saes(), self.store.label_counts()

        records, counts = await asyncio.to_thread(read)
        snap = self.state.snapshot()
        return [self.sae_view(r, snap, counts.get(r.sae_id, 0)) for r in records]

    async def get_sae(self, sae_id: str) -> dict[str, Any]:
        def read() -> tuple[SAERecord, dict[str, int]]:
            return self.store.sae(sae_id), self.store.label_counts(sae_id)

        record, counts = await asyncio.to_thread(read)
        return self.sae_view(record, self.state.snapshot(), counts.get(sae_id, 0))

    async def delete_sae(self, sae_id: str) -> None:
        if self.state.snapshot().attached(sae_id):
            raise Conflict(f"SAE {sae_id!r} is attached; detach it first", param="sae_id", code="sae_attached")
        await asyncio.to_thread(self.store.delete_sae, sae_id)
        self.labels.forget(sae_id)
        self.state.touch()

    async def attach(self, sae_id: str, layer: int | None) -> dict[str, Any]:
        """Attach a registered SAE to the resident model at its layer (or ``layer``)."""
        from . import sae as sae_weights  # torch: imported when an SAE is first attached

        engine, resident_id = self.host.current_model()
        record = await asyncio.to_thread(self.store.sae, sae_id)
        points = engine.steering_points  # every hook point, or where an engine steers without callbacks
        if not points:
            raise FieldNotHonoured(
                f"the {engine.name} engine has no hook points: SAEs cannot be attached to model {resident_id!r}",
                param="sae_id",
            )
        d_model = engine.info.d_model
        if record.d_in != d_model:
            raise InvalidParameter(
                f"SAE {sae_id!r} has d_in {record.d_in}, but model {resident_id!r} has hidden size {d_model}",
                param="sae_id",
                code="sae_incompatible",
            )
        layer = record.layer if layer is None else layer
        point = record.hook_point.rsplit("hook_", 1)[1]
        # the engine's own point (so its name is typed), or None where it cannot steer
        hook_point = next((p for p in points if (p.layer, p.point) == (layer, point)), None)
        if hook_point is None:
            n_layers = engine.info.n_layers
            if n_layers is not None and 0 <= layer < n_layers:  # the layer exists: the engine cannot steer there
                raise FieldNotHonoured(
                    f"blocks.{layer}.hook_{point} cannot be steered on the {engine.name} engine "
                    f"(it steers {describe_points(points)})",
                    param="layer",
                )
            raise InvalidParameter(f"model {resident_id!r} has no layer {layer} (it has {n_layers})", param="layer")
        snap = self.state.snapshot()
        existing = snap.attachments.get((sae_id, layer))
        if existing is not None:
            return self.attachment_view(existing, resident_id, snap)
        loaded = next((a.sae for a in snap.attached(sae_id)), None)
        if loaded is None:

            def load() -> LoadedSAE:  # the weights' shapes are checked as they load
                self.check_still_allowed(record)
                cfg = read_config(Path(record.path))
                if (cfg.d_in, cfg.d_sae, cfg.hook_name, cfg.architecture) != (
                    record.d_in,
                    record.d_sae,
                    record.hook_point,
                    record.architecture,
                ):
                    raise SAEUnreadable(
                        f"{record.path} changed since it was registered; register it again", param="sae_id"
                    )
                # an engine without callbacks takes its vectors as floats: built on the CPU
                device = engine.info.device if engine.hook_points else "cpu"
                return sae_weights.load(sae_id, Path(record.path), cfg, device)

            loaded = await asyncio.to_thread(load)
        # an unload that began while the weights loaded wins: it never waits for them, and nothing attaches
        attached = None
        if self.host.still_resident(engine):
            attached = self.state.attach(Attachment(loaded, layer, hook_point.point), engine.info.load_id)
        if attached is None:
            raise ModelBusy(
                f"model {resident_id!r} began to unload while SAE {sae_id!r} was attaching; nothing was attached "
                "(load the model and attach it again)"
            )
        log.info("attached SAE %s at layer %d of %s", sae_id, layer, resident_id)
        return self.attachment_view(attached.attachments[(sae_id, layer)], resident_id, attached)

    def check_still_allowed(self, record: SAERecord) -> None:
        """A registration older than the current ``MILLM_SAE_DIRS`` may not read outside it."""
        try:
            confined_path(record.path, self.sae_dirs(), param="path", setting="MILLM_SAE_DIRS")
        except InvalidParameter as exc:
            raise SAEUnreadable(
                f"SAE {record.sae_id!r} was registered from outside the directories "
                f"MILLM_SAE_DIRS now allows; {exc.message}",
                param="sae_id",
            ) from None

    def attachment_view(self, attachment: Attachment, model_id: str, snap: Snapshot) -> dict[str, Any]:
        return {
            "sae_id": attachment.sae_id,
            "layer": attachment.layer,
            "hook_point": attachment.hook_name,
            "model": model_id,
            "epoch": snap.epoch,
        }

    async def detach(self, sae_id: str, layer: int | None) -> dict[str, Any]:
        """Detach an SAE (at ``layer``, or everywhere it is attached); its live values go too."""
        await asyncio.to_thread(self.store.sae, sae_id)
        found = [a for a in self.state.snapshot().attached(sae_id) if layer is None or a.layer == layer]
        if not found:
            where = "" if layer is None else f" at layer {layer}"
            raise SAENotAttached(f"SAE {sae_id!r} is not attached{where}", param="sae_id")
        snap = self.state.detach([a.key for a in found])
        return {
            "sae_id": sae_id,
            "detached": [{"layer": a.layer, "hook_point": a.hook_name} for a in found],
            "epoch": snap.epoch,
        }

    # --- live values ----------------------------------------------------------------------
    def set_manual(self, sae_id: str, layer: int | None, features: Features) -> dict[str, Any]:
        """Replace the live values on one attachment (``features: []`` clears them)."""
        attachment = select_attachment(self.state.snapshot(), sae_id, layer, "")
        check_indices([i for i, _ in features], attachment.sae.cfg.d_sae, sae_id, lambda j: f"features[{j}].index")
        snap = self.state.set_manual(attachment.key, features)
        return {**self.manual_view(snap, attachment.key), "epoch": snap.epoch}

    def clear_manual(self) -> dict[str, Any]:
        return self.steering_view(self.state.clear_manual())

    # --- profiles -------------------------------------------------------------------------
    async def create_profile(self, name: str, sae_id: str, layer: int | None, features: Features) -> dict[str, Any]:
        if name in RESERVED_PROFILE_NAMES:
            raise InvalidParameter(f"{name!r} is reserved; choose another profile name", param="name")
        record = await asyncio.to_thread(self.store.sae, sae_id)
        check_indices([i for i, _ in features], record.d_sae, sae_id, lambda j: f"features[{j}].index")
        profile = await asyncio.to_thread(
            self.store.add_profile, name, sae_id, record.layer if layer is None else layer, features
        )
        return (await self.with_labels([self.profile_view(profile, self.state.touch())]))[0]

    async def list_profiles(self) -> list[dict[str, Any]]:
        records = await asyncio.to_thread(self.store.profiles)
        snap = self.state.snapshot()
        return await self.with_labels([self.profile_view(r, snap) for r in records])

    async def get_profile(self, name: str) -> dict[str, Any]:
        record = await asyncio.to_thread(self.store.profile, name)
        return (await self.with_labels([self.profile_view(record, self.state.snapshot())]))[0]

    async def delete_profile(self, name: str) -> None:
        await asyncio.to_thread(self.store.delete_profile, name)
        self.state.profile_deleted(name)

    async def activate(self, name: str) -> dict[str, Any]:
        record = await asyncio.to_thread(self.store.profile, name)
        profile = await asyncio.to_thread(self.store.load_profile, name)
        snap = self.state.activate(profile)
        return (await self.with_labels([{**self.profile_view(record, snap), "epoch": snap.epoch}]))[0]

    def deactivate(self) -> dict[str, Any]:
        snap = self.state.activate(None)
        return {"active_profile": None, "epoch": snap.epoch}

    # --- the lock -------------------------------------------------------------------------
    def lock_view(self) -> dict[str, Any]:
        return {"locked": self.locked_model is not None, "model": self.locked_model}

    async def set_lock(self, model_id: str | None) -> dict[str, Any]:
        """Lock ``/v1/models`` to one model (default: the resident one); None unlocks."""
        await asyncio.to_thread(self.store.set_lock, model_id)
        self.locked_model = model_id
        self.state.touch()
        return self.lock_view()

    def lock_target(self, model_id: str | None) -> str:
        if model_id is None:
            resident = self.host.resident_model_id()
            if resident is None:
                raise InvalidParameter("no model is resident; name the model to lock", param="model")
            return resident
        return self.host.resolve_model_id(model_id)


def describe_points(points: Sequence[HookPoint]) -> str:
    """``hook_resid_post at layers 1-29; hook_resid_pre at layers 2-29``: contiguous layers as ranges."""
    parts = []
    for kind in sorted({p.point for p in points}, reverse=True):
        layers = sorted(p.layer for p in points if p.point == kind)
        runs: list[list[int]] = []
        for layer in layers:
            if runs and layer == runs[-1][1] + 1:
                runs[-1][1] = layer
            else:
                runs.append([layer, layer])
        spans = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
        parts.append(f"hook_{kind} at layers {spans}")
    return "; ".join(parts)
