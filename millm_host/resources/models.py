"""``/v1/models`` (OpenAI) and ``/api/models`` (management), LoRA adapters included."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..adapters import AdapterLoadRequest
from ..bodies.validate import validate
from ..engine import LoraAdapter
from ..errors import ModelNotFound
from ..openapi import operation
from ..registry import ModelEntry
from ..response_bodies import AdapterDetail, AdapterList, Model, ModelDetail, ModelDetailList, ModelList
from .common import read_json

if TYPE_CHECKING:
    from ..adapters import AdapterRegistry
    from ..registry import ModelRegistry
    from ..scheduler import Scheduler
    from ..settings import Settings


class ModelsHost(Protocol):
    """What the model routes use of the host."""

    registry: ModelRegistry
    adapters: AdapterRegistry
    scheduler: Scheduler
    settings: Settings

    def listed_models(self) -> list[Any]: ...


def openai_model(entry: ModelEntry) -> dict[str, Any]:
    d = entry.descriptor
    owner = (d.hf_id or "").split("/")[0] or "millm"
    return {"id": entry.id, "object": "model", "created": entry.created, "owned_by": owner}


def openai_adapter(host: ModelsHost, entry: ModelEntry, adapter: LoraAdapter) -> dict[str, Any]:
    """An adapter as vLLM lists one: its base as ``parent``, its directory as ``root``."""
    created = host.adapters.created.get(adapter.name, entry.created)
    model = openai_model(entry)
    model.update(id=f"{entry.id}:{adapter.name}", created=created, parent=entry.id, root=adapter.path)
    return model


class OpenAIModels:
    def __init__(self, host: ModelsHost) -> None:
        self.host = host

    @operation("The models this server serves, each followed by its LoRA adapters", response=ModelList)
    async def on_get(self, req, resp) -> None:
        data = []
        for entry in self.host.listed_models():
            data.append(openai_model(entry))
            data += [openai_adapter(self.host, entry, a) for a in self.host.adapters.on(entry.id)]
        resp.media = {"object": "list", "data": data}


class OpenAIModel:
    def __init__(self, host: ModelsHost) -> None:
        self.host = host

    @operation("One model", response=Model, errors=(404,))
    async def on_get(self, req, resp, model_id: str) -> None:
        entry, adapter = self.host.adapters.resolve(model_id)  # an alias answers with the id it stands for
        if entry not in self.host.listed_models():
            raise ModelNotFound(f"the model {model_id!r} does not exist", param="model")
        resp.media = openai_model(entry) if adapter is None else openai_adapter(self.host, entry, adapter)


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


def adapter_detail(entry: ModelEntry, adapter: LoraAdapter) -> dict[str, Any]:
    return {"id": f"{entry.id}:{adapter.name}", "name": adapter.name, "base": entry.id, "path": adapter.path}


class ModelAdapters:
    """``/api/models/{id}/adapters``: the LoRA adapters served on a model, loaded and unloaded live."""

    def __init__(self, host: ModelsHost) -> None:
        self.host = host

    @operation("The LoRA adapters served on the model", response=AdapterList, errors=(404,))
    async def on_get(self, req, resp, model_id: str) -> None:
        entry = self.host.registry.by_id(model_id)
        resp.media = {"data": [adapter_detail(entry, a) for a in self.host.adapters.on(entry.id)]}

    @operation(
        "Serve a LoRA adapter on the model (a directory inside MILLM_LORA_DIRS); read now when the model is resident",
        request=AdapterLoadRequest,
        response=AdapterDetail,
        errors=(404, 409),
    )
    async def on_post(self, req, resp, model_id: str) -> None:
        entry = self.host.registry.by_id(model_id)
        body = validate(AdapterLoadRequest, await read_json(req, self.host.settings))
        adapters = self.host.adapters
        adapter = adapters.add(body.name, adapters.confined(body.path), entry)
        try:
            await self._on_resident(entry, lambda engine: engine.load_adapter(adapter))
        except BaseException:
            adapters.remove(entry, adapter.name)  # files the model cannot take are not served
            raise
        resp.media = adapter_detail(entry, adapter)

    @operation("Stop serving a LoRA adapter; its weights are freed once no generation uses them", errors=(404,))
    async def on_delete_adapter(self, req, resp, model_id: str, name: str) -> None:
        entry = self.host.registry.by_id(model_id)
        adapter = self.host.adapters.remove(entry, name)
        await self._on_resident(entry, lambda engine: engine.unload_adapter(adapter.name))
        resp.media = {"id": f"{entry.id}:{adapter.name}", "deleted": True}

    async def _on_resident(self, entry: ModelEntry, work: Any) -> None:
        """``work(engine)`` on the engine thread when ``entry`` is resident (else its next load reads it on use)."""
        registry = self.host.registry

        def run() -> None:
            engine = registry.engine
            if registry.resident is entry and engine is not None and registry.still_resident(engine):
                work(engine)

        await self.host.scheduler.run(run)
