"""The steering management API (JSON; errors in OpenAI's shape).

``/api/saes``: register, list, show, delete SAELens directories; attach and detach
them on the resident model; import, list and search their feature labels. ``/api/steering``: the live values (and
``/api/steering/lock``). ``/api/profiles``: saved profiles, activation.
``/api/clusters`` and ``/api/circuits``: imported documents, activation, dials.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

from millm_host.api import InvalidParameter, JsonResource, Param, check_display_name, operation

from .features import Features, non_negative_int, parse_features
from .hashing import STRENGTH_LIMIT
from .label_service import PAGE_MAX
from .schemas import (
    CircuitDocument,
    ClusterDocument,
    CreateProfile,
    FeatureLabel,
    FeatureLabelPage,
    ImportLabels,
    IntensityBody,
    LabelImport,
    LabelsDeleted,
    LayerBody,
    LockBody,
    RegisterSAE,
    SetSteering,
)

if TYPE_CHECKING:
    from millm_host.api import Host

    from .service import SteeringService

PROFILE_NAME_MAX = 200


def _body(raw: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    """The body's keys, checked: unknown keys and missing required ones are refused."""
    unknown = sorted(set(raw) - set(required) - set(optional))
    if unknown:
        raise InvalidParameter(f"unknown fields: {', '.join(unknown)}", param=unknown[0])
    for key in required:
        if raw.get(key) is None:
            raise InvalidParameter(f"{key} is required", param=key)
    return raw


def _string(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidParameter(f"{key} must be a non-empty string", param=key)
    return value


def _required_string(body: dict[str, Any], key: str) -> str:
    """``_string`` of a key that ``_body`` has already required (so never None)."""
    value = _string(body, key)
    assert value is not None
    return value


def _layer(body: dict[str, Any]) -> int | None:
    value = body.get("layer")
    return None if value is None else non_negative_int(value, "layer")


def _profile_name(value: str) -> str:
    check_display_name(value, "name")
    if len(value) > PROFILE_NAME_MAX or "/" in value:
        raise InvalidParameter(f"name must be 1-{PROFILE_NAME_MAX} characters without '/'", param="name")
    return value


async def _features(value: Any, max_abs: float | None = None) -> Features:
    """``parse_features`` for the management API, off the event loop (a list can fill the body)."""
    return await asyncio.to_thread(parse_features, value, "features", strict_keys=True, max_abs=max_abs)


class _Resource(JsonResource):
    """A steering route: the host's body reading, and the plugin's service.

    Every changing responder (``on_post*``, ``on_put*``, ``on_delete*``) catches up with the
    desired state first and stores the live state as the desired state after (desired.py).
    """

    def __init__(self, host: Host, service: SteeringService) -> None:
        super().__init__(host)
        self.service = service

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, responder in list(vars(cls).items()):
            if name.startswith(CHANGING) and callable(responder):
                setattr(cls, name, _changing(responder))


CHANGING = ("on_post", "on_put", "on_delete")


def _changing(responder: Any) -> Any:
    @functools.wraps(responder)
    async def changing(self: _Resource, req, resp, **params: Any) -> None:
        await self.service.converger.catch_up()
        await responder(self, req, resp, **params)
        await self.service.converger.publish()

    return changing


class SAEs(_Resource):
    """``/api/saes``."""

    @operation("The registered SAEs")
    async def on_get(self, req, resp) -> None:
        resp.media = {"object": "list", "data": await self.service.list_saes()}

    @operation("Register a SAELens directory", request=RegisterSAE, errors=(404, 409))
    async def on_post(self, req, resp) -> None:
        body = _body(await self.json(req), ("path",), ("sae_id",))
        resp.media = await self.service.register_sae(_required_string(body, "path"), _string(body, "sae_id"))


class SAE(_Resource):
    """``/api/saes/{sae_id}`` and its ``attach`` / ``detach`` actions."""

    @operation("One SAE", errors=(404,))
    async def on_get(self, req, resp, sae_id: str) -> None:
        resp.media = await self.service.get_sae(sae_id)

    @operation("Forget an SAE", errors=(404, 409))
    async def on_delete(self, req, resp, sae_id: str) -> None:
        await self.service.delete_sae(sae_id)
        resp.media = {"sae_id": sae_id, "deleted": True}

    @operation(
        "Attach the SAE to the resident model", request=LayerBody, request_required=False, errors=(404, 409, 503)
    )
    async def on_post_attach(self, req, resp, sae_id: str) -> None:
        body = _body(await self.json(req, required=False), (), ("layer",))
        resp.media = await self.service.attach(sae_id, _layer(body))

    @operation("Detach the SAE", request=LayerBody, request_required=False, errors=(404, 409, 503))
    async def on_post_detach(self, req, resp, sae_id: str) -> None:
        body = _body(await self.json(req, required=False), (), ("layer",))
        resp.media = await self.service.detach(sae_id, _layer(body))


class Labels(_Resource):
    """``/api/saes/{sae_id}/labels`` and ``/api/saes/{sae_id}/labels/{index}``: feature labels."""

    @operation(
        "Import feature labels (Neuronpedia's export, SAELens' autointerp lines)",
        request=ImportLabels,
        response=LabelImport,
        errors=(404,),
    )
    async def on_post(self, req, resp, sae_id: str) -> None:
        body = _body(await self.json(req), (), ("path", "content", "labels", "mode", "duplicates"))
        resp.media = await self.service.labelling.import_labels(sae_id, body)

    @operation(
        "The SAE's labels in feature order; q: those holding this text (case-insensitive)",
        response=FeatureLabelPage,
        errors=(404,),
        query=[
            Param("q", description="Text the label holds, case-insensitive"),
            Param("limit", {"type": "integer", "minimum": 1, "maximum": PAGE_MAX}, "Labels per page (default 100)"),
            Param("after", {"type": "integer", "minimum": 0}, "Continue after this feature index (last_id)"),
        ],
    )
    async def on_get(self, req, resp, sae_id: str) -> None:
        resp.media = await self.service.labelling.search(
            sae_id, req.get_param("q") or None, req.get_param("limit"), req.get_param("after")
        )

    @operation("Forget the SAE's labels", response=LabelsDeleted, errors=(404,))
    async def on_delete(self, req, resp, sae_id: str) -> None:
        resp.media = await self.service.labelling.delete_labels(sae_id)

    @operation("One feature's label", response=FeatureLabel, errors=(404,))
    async def on_get_one(self, req, resp, sae_id: str, index: str) -> None:
        resp.media = await self.service.labelling.get_label(sae_id, index)


class Steering(_Resource):
    """``/api/steering``: the live (manual) values."""

    async def _labelled(self, view: dict[str, Any]) -> dict[str, Any]:
        await self.service.with_labels(view["manual"])
        return view

    @operation("The live steering values")
    async def on_get(self, req, resp) -> None:
        resp.media = await self._labelled(self.service.steering_view(self.service.state.snapshot()))

    @operation("Set the live steering values", request=SetSteering, errors=(404, 409))
    async def on_put(self, req, resp) -> None:
        body = _body(await self.json(req), ("sae_id", "features"), ("layer",))
        features = await _features(body["features"], max_abs=STRENGTH_LIMIT)
        view = self.service.set_manual(_required_string(body, "sae_id"), _layer(body), features)
        resp.media = (await self.service.with_labels([view]))[0]

    @operation("Clear the live steering values")
    async def on_delete(self, req, resp) -> None:
        resp.media = await self._labelled(self.service.clear_manual())


class Lock(_Resource):
    """``/api/steering/lock``: narrow ``/v1/models`` to one model."""

    @operation("The model lock")
    async def on_get(self, req, resp) -> None:
        resp.media = self.service.lock_view()

    @operation("Lock /v1/models to one model", request=LockBody, request_required=False, errors=(404, 409, 503))
    async def on_post(self, req, resp) -> None:
        body = _body(await self.json(req, required=False), (), ("model",))
        resp.media = await self.service.set_lock(self.service.lock_target(_string(body, "model")))

    @operation("Lift the model lock", errors=(409, 503))
    async def on_delete(self, req, resp) -> None:
        resp.media = await self.service.set_lock(None)


class Profiles(_Resource):
    """``/api/profiles`` and ``/api/profiles/deactivate``."""

    @operation("The saved profiles")
    async def on_get(self, req, resp) -> None:
        resp.media = {"object": "list", "data": await self.service.list_profiles()}

    @operation("Save a profile", request=CreateProfile, errors=(404, 409))
    async def on_post(self, req, resp) -> None:
        body = _body(await self.json(req), ("name", "sae_id", "features"), ("layer",))
        features = await _features(body["features"])
        if not features:
            raise InvalidParameter("features must list at least one feature", param="features")
        resp.media = await self.service.create_profile(
            _profile_name(_required_string(body, "name")), _required_string(body, "sae_id"), _layer(body), features
        )

    @operation("Deactivate the active profile", errors=(409,))
    async def on_post_deactivate(self, req, resp) -> None:
        resp.media = self.service.deactivate()


class Profile(_Resource):
    """``/api/profiles/{name}`` and its ``activate`` action."""

    @operation("One profile", errors=(404,))
    async def on_get(self, req, resp, name: str) -> None:
        resp.media = await self.service.get_profile(name)

    @operation("Delete a profile", errors=(404, 409))
    async def on_delete(self, req, resp, name: str) -> None:
        await self.service.delete_profile(name)
        resp.media = {"name": name, "deleted": True}

    @operation("Activate a profile", errors=(404, 409))
    async def on_post_activate(self, req, resp, name: str) -> None:
        resp.media = await self.service.activate(name)


class Clusters(_Resource):
    """``/api/clusters``: import and list ``mi.cluster/v1`` documents."""

    @operation("The imported clusters")
    async def on_get(self, req, resp) -> None:
        resp.media = {"object": "list", "data": await self.service.catalog.list_clusters()}

    @operation("Import a mi.cluster/v1 document", request=ClusterDocument, errors=(404, 409))
    async def on_post(self, req, resp) -> None:
        resp.media = await self.service.catalog.import_cluster(await self.json(req))


class Cluster(_Resource):
    """``/api/clusters/{cluster_id}`` and its actions."""

    @operation("One cluster", errors=(404,))
    async def on_get(self, req, resp, cluster_id: str) -> None:
        resp.media = await self.service.catalog.get_cluster(cluster_id)

    @operation("Delete a cluster (and the profile it is served as)", errors=(404, 409))
    async def on_delete(self, req, resp, cluster_id: str) -> None:
        await self.service.catalog.delete_cluster(cluster_id)
        resp.media = {"cluster_id": cluster_id, "deleted": True}

    @operation("The cluster's document, as imported", errors=(404,))
    async def on_get_export(self, req, resp, cluster_id: str) -> None:
        resp.media = await self.service.catalog.export_cluster(cluster_id)

    @operation("Activate the cluster (as the active profile)", errors=(404, 409))
    async def on_post_activate(self, req, resp, cluster_id: str) -> None:
        resp.media = await self.service.catalog.activate_cluster(cluster_id)

    @operation("Deactivate the cluster", errors=(404, 409))
    async def on_post_deactivate(self, req, resp, cluster_id: str) -> None:
        resp.media = await self.service.catalog.deactivate_cluster(cluster_id)

    @operation("Set the cluster's persistent dial", request=IntensityBody, errors=(404, 409))
    async def on_put_intensity(self, req, resp, cluster_id: str) -> None:
        body = _body(await self.json(req), ("intensity",))
        resp.media = await self.service.catalog.set_cluster_intensity(cluster_id, body["intensity"])


class Circuits(_Resource):
    """``/api/circuits`` and ``/api/circuits/active``."""

    @operation("The imported circuits")
    async def on_get(self, req, resp) -> None:
        resp.media = {"object": "list", "data": await self.service.catalog.list_circuits()}

    @operation("Import a mi.circuit/v1 document", request=CircuitDocument, errors=(409,))
    async def on_post(self, req, resp) -> None:
        resp.media = await self.service.catalog.import_circuit(await self.json(req))

    @operation("The active circuits, and what each really steers")
    async def on_get_active(self, req, resp) -> None:
        resp.media = await self.service.catalog.active_circuits()


class Circuit(_Resource):
    """``/api/circuits/{circuit_id}`` and its actions."""

    @operation("One circuit", errors=(404,))
    async def on_get(self, req, resp, circuit_id: str) -> None:
        resp.media = await self.service.catalog.get_circuit(circuit_id)

    @operation("Delete a circuit", errors=(404, 409))
    async def on_delete(self, req, resp, circuit_id: str) -> None:
        await self.service.catalog.delete_circuit(circuit_id)
        resp.media = {"circuit_id": circuit_id, "deleted": True}

    @operation("The circuit's document, as imported", errors=(404,))
    async def on_get_export(self, req, resp, circuit_id: str) -> None:
        resp.media = await self.service.catalog.export_circuit(circuit_id)

    @operation("Activate the circuit", errors=(404, 409))
    async def on_post_activate(self, req, resp, circuit_id: str) -> None:
        resp.media = await self.service.catalog.activate_circuit(circuit_id)

    @operation("Deactivate the circuit", errors=(404, 409))
    async def on_post_deactivate(self, req, resp, circuit_id: str) -> None:
        resp.media = await self.service.catalog.deactivate_circuit(circuit_id)

    @operation("Set the circuit's persistent dial", request=IntensityBody, errors=(404, 409))
    async def on_put_intensity(self, req, resp, circuit_id: str) -> None:
        body = _body(await self.json(req), ("intensity",))
        resp.media = await self.service.catalog.set_circuit_intensity(circuit_id, body["intensity"])


def install(host: Host, service: SteeringService, add_route) -> None:
    """Add every management route; each change becomes the desired state of every replica (desired.py)."""
    saes, sae = SAEs(host, service), SAE(host, service)
    add_route("/api/saes", saes)
    add_route("/api/saes/{sae_id}", sae)
    add_route("/api/saes/{sae_id}/attach", sae, suffix="attach")
    add_route("/api/saes/{sae_id}/detach", sae, suffix="detach")
    labels = Labels(host, service)
    add_route("/api/saes/{sae_id}/labels", labels)
    add_route("/api/saes/{sae_id}/labels/{index}", labels, suffix="one")
    add_route("/api/steering", Steering(host, service))
    add_route("/api/steering/lock", Lock(host, service))
    profiles, profile = Profiles(host, service), Profile(host, service)
    add_route("/api/profiles", profiles)
    add_route("/api/profiles/deactivate", profiles, suffix="deactivate")
    add_route("/api/profiles/{name}", profile)
    add_route("/api/profiles/{name}/activate", profile, suffix="activate")
    clusters, cluster = Clusters(host, service), Cluster(host, service)
    add_route("/api/clusters", clusters)
    add_route("/api/clusters/{cluster_id}", cluster)
    for action in ("export", "activate", "deactivate", "intensity"):
        add_route(f"/api/clusters/{{cluster_id}}/{action}", cluster, suffix=action)
    circuits, circuit = Circuits(host, service), Circuit(host, service)
    add_route("/api/circuits", circuits)
    add_route("/api/circuits/active", circuits, suffix="active")
    add_route("/api/circuits/{circuit_id}", circuit)
    for action in ("export", "activate", "deactivate", "intensity"):
        add_route(f"/api/circuits/{{circuit_id}}/{action}", circuit, suffix=action)
