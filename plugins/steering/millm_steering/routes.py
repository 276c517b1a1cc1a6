"""The steering management API (JSON; errors in OpenAI's shape).

``/api/saes``: register, list, show, delete SAELens directories; attach and detach
them on the resident model. ``/api/steering``: the live values (and
``/api/steering/lock``). ``/api/profiles``: saved profiles, activation.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from millm_host.errors import InvalidParameter
from millm_host.resources.common import read_json

from .features import Features, non_negative_int, parse_features
from .hashing import STRENGTH_LIMIT

if TYPE_CHECKING:
    from millm_host.app import Host

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


def _layer(body: dict[str, Any]) -> int | None:
    value = body.get("layer")
    return None if value is None else non_negative_int(value, "layer")


#: Linux's limits: longer names fail in the kernel with ENAMETOOLONG, which is the client's to fix.
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4095


def _path(value: str | None) -> str | None:
    """A path the filesystem can be asked about: no NUL, no component over 255 bytes, 4095 in all."""
    if value is None:
        return None
    encoded = value.encode("utf-8", "surrogateescape")
    if b"\0" in encoded:
        raise InvalidParameter("path must not contain a NUL character", param="path")
    if len(encoded) > PATH_MAX_BYTES:
        raise InvalidParameter(f"path is {len(encoded)} bytes; the limit is {PATH_MAX_BYTES}", param="path")
    longest = max(encoded.split(b"/"), key=len)
    if len(longest) > NAME_MAX_BYTES:
        raise InvalidParameter(
            f"path has a component of {len(longest)} bytes; a file or directory name is at most {NAME_MAX_BYTES}",
            param="path")
    return value


def _profile_name(value: str) -> str:
    if len(value) > PROFILE_NAME_MAX or "/" in value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise InvalidParameter(
            f"name must be 1-{PROFILE_NAME_MAX} characters without '/' or control characters", param="name")
    return value


async def _features(value: Any, max_abs: float | None = None) -> Features:
    """``parse_features`` for the management API, off the event loop (a list can fill the body)."""
    return await asyncio.to_thread(parse_features, value, "features", strict_keys=True, max_abs=max_abs)


class _Resource:
    def __init__(self, host: Host, service: SteeringService) -> None:
        self.host = host
        self.service = service

    async def body(self, req: Any, required: bool = True) -> dict[str, Any]:
        return await read_json(req, self.host.settings, required=required)


class SAEs(_Resource):
    """``/api/saes``."""

    async def on_get(self, req, resp) -> None:
        resp.media = {"object": "list", "data": await self.service.list_saes()}

    async def on_post(self, req, resp) -> None:
        body = _body(await self.body(req), ("path",), ("sae_id",))
        resp.media = await self.service.register_sae(_path(_string(body, "path")), _string(body, "sae_id"))


class SAE(_Resource):
    """``/api/saes/{sae_id}`` and its ``attach`` / ``detach`` actions."""

    async def on_get(self, req, resp, sae_id: str) -> None:
        resp.media = await self.service.get_sae(sae_id)

    async def on_delete(self, req, resp, sae_id: str) -> None:
        await self.service.delete_sae(sae_id)
        resp.media = {"sae_id": sae_id, "deleted": True}

    async def on_post_attach(self, req, resp, sae_id: str) -> None:
        body = _body(await self.body(req, required=False), (), ("layer",))
        resp.media = await self.service.attach(sae_id, _layer(body))

    async def on_post_detach(self, req, resp, sae_id: str) -> None:
        body = _body(await self.body(req, required=False), (), ("layer",))
        resp.media = await self.service.detach(sae_id, _layer(body))


class Steering(_Resource):
    """``/api/steering``: the live (manual) values."""

    async def on_get(self, req, resp) -> None:
        resp.media = self.service.steering_view(self.service.state.snapshot())

    async def on_put(self, req, resp) -> None:
        body = _body(await self.body(req), ("sae_id", "features"), ("layer",))
        features = await _features(body["features"], max_abs=STRENGTH_LIMIT)
        resp.media = self.service.set_manual(_string(body, "sae_id"), _layer(body), features)

    async def on_delete(self, req, resp) -> None:
        resp.media = self.service.clear_manual()


class Lock(_Resource):
    """``/api/steering/lock``: narrow ``/v1/models`` to one model."""

    async def on_get(self, req, resp) -> None:
        resp.media = self.service.lock_view()

    async def on_post(self, req, resp) -> None:
        body = _body(await self.body(req, required=False), (), ("model",))
        resp.media = await self.service.set_lock(self.service.lock_target(_string(body, "model")))

    async def on_delete(self, req, resp) -> None:
        resp.media = await self.service.set_lock(None)


class Profiles(_Resource):
    """``/api/profiles`` and ``/api/profiles/deactivate``."""

    async def on_get(self, req, resp) -> None:
        resp.media = {"object": "list", "data": await self.service.list_profiles()}

    async def on_post(self, req, resp) -> None:
        body = _body(await self.body(req), ("name", "sae_id", "features"), ("layer",))
        features = await _features(body["features"])
        if not features:
            raise InvalidParameter("features must list at least one feature", param="features")
        resp.media = await self.service.create_profile(
            _profile_name(_string(body, "name")), _string(body, "sae_id"), _layer(body), features)

    async def on_post_deactivate(self, req, resp) -> None:
        resp.media = self.service.deactivate()


class Profile(_Resource):
    """``/api/profiles/{name}`` and its ``activate`` action."""

    async def on_get(self, req, resp, name: str) -> None:
        resp.media = await self.service.get_profile(name)

    async def on_delete(self, req, resp, name: str) -> None:
        await self.service.delete_profile(name)
        resp.media = {"name": name, "deleted": True}

    async def on_post_activate(self, req, resp, name: str) -> None:
        resp.media = await self.service.activate(name)


def install(host: Host, service: SteeringService, add_route) -> None:
    """Add every management route."""
    saes, sae = SAEs(host, service), SAE(host, service)
    add_route("/api/saes", saes)
    add_route("/api/saes/{sae_id}", sae)
    add_route("/api/saes/{sae_id}/attach", sae, suffix="attach")
    add_route("/api/saes/{sae_id}/detach", sae, suffix="detach")
    add_route("/api/steering", Steering(host, service))
    add_route("/api/steering/lock", Lock(host, service))
    profiles, profile = Profiles(host, service), Profile(host, service)
    add_route("/api/profiles", profiles)
    add_route("/api/profiles/deactivate", profiles, suffix="deactivate")
    add_route("/api/profiles/{name}", profile)
    add_route("/api/profiles/{name}/activate", profile, suffix="activate")
