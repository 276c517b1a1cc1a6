"""``/v1/models`` (OpenAI) and ``/api/models`` (management)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..errors import ModelNotFound
from ..openapi import operation
from ..registry import ModelEntry
from ..response_bodies import Model, ModelDetail, ModelDetailList, ModelList

if TYPE_CHECKING:
    from ..registry import ModelRegistry


class ModelsHost(Protocol):
    """What the model routes use of the host."""

    registry: ModelRegistry

    def listed_models(self) -> list[Any]: ...


def openai_model(entry: ModelEntry) -> dict[str, Any]:
    d = entry.descriptor
    owner = (d.hf_id or "").split("/")[0] or "millm"
    return {"id": entry.id, "object": "model", "created": entry.created, "owned_by": owner}


class OpenAIModels:
    def __init__(self, host: ModelsHost) -> None:
        self.host = host

    @operation("The models this server serves", response=ModelList)
    async def on_get(self, req, resp) -> None:
        resp.media = {
            "object": "list",
            "data": [openai_model(e) for e in self.host.listed_models()],
        }


class OpenAIModel:
    def __init__(self, host: ModelsHost) -> None:
        self.host = host

    @operation("One model", response=Model, errors=(404,))
    async def on_get(self, req, resp, model_id: str) -> None:
        entry = self.host.registry.resolve(model_id)  # an alias answers with the id it stands for
        if entry not in self.host.listed_models():
            raise ModelNotFound(f"the model {model_id!r} does not exist", param="model")
        resp.media = openai_model(entry)


def model_detail(host: ModelsHost, entry: ModelEntry) -> dict[str, Any]:
    """A model's state and the identity probes are checked against."""
    return host.registry.detail(entry)


class ManagedModels:
    def __init__(self, host: ModelsHost) -> None:
        self.host = host

    @operation("Every model found, with its state", response=ModelDetailList)
    async def on_get(self, req, resp) -> None:
        resp.media = {"data": [model_detail(self.host, e) for e in self.host.registry.entries.values()]}


class ManagedModel:
    def __init__(self, host: ModelsHost) -> None:
        self.host = host

    @operation("A model's state, and its identity while resident", response=ModelDetail, errors=(404,))
    async def on_get(self, req, resp, model_id: str) -> None:
        resp.media = model_detail(self.host, self.host.registry.by_id(model_id))

    @operation("Make the model resident (unloading the one that is)", response=ModelDetail, errors=(404, 503))
    async def on_post_load(self, req, resp, model_id: str) -> None:
        entry = self.host.registry.by_id(model_id)
        await self.host.registry.load(entry)
        resp.media = model_detail(self.host, entry)

    @operation("Unload the model", response=ModelDetail, errors=(404, 503))
    async def on_post_unload(self, req, resp, model_id: str) -> None:
        entry = self.host.registry.by_id(model_id)
        await self.host.registry.unload(entry)
        resp.media = model_detail(self.host, entry)
