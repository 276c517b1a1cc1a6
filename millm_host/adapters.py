"""LoRA adapters: which exist, which base model each serves on, and what a request's ``model`` names.

Found at start in ``MILLM_LORA_DIRS`` (each subdirectory holding ``adapter_config.json`` is an
adapter named after its directory), added and removed without a restart by the management
routes (``/api/models/{id}/adapters``). A request names one as vLLM does, ``"<base>:<adapter>"``,
or by its bare name (no model has that id: adapter names refuse model ids). No torch here: the
engine reads the weights (``Engine.load_adapter``) when one is added or first used.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field

from .engine import LORA_ADAPTERS, LoraAdapter
from .errors import InvalidParameter, MillmError, ModelNotFound
from .naming import check_display_name
from .paths import confined_path, plain_name

if TYPE_CHECKING:
    from .registry import ModelEntry, ModelRegistry
    from .settings import Settings

log = logging.getLogger("millm.adapters")

#: The file that makes a directory a PEFT adapter.
CONFIG = "adapter_config.json"
SETTING = "MILLM_LORA_DIRS"


class AdapterExists(MillmError):
    """Another adapter already has this name."""

    status, code = 409, "adapter_exists"


class AdapterLoadRequest(BaseModel):
    """``POST /api/models/{id}/adapters``: serve the adapter in ``path`` (inside ``MILLM_LORA_DIRS``) as ``name``."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=200)]
    path: Annotated[str, Field(min_length=1)]


class AdapterRegistry:
    """Every adapter by name (names are unique over all bases: a bare name picks one)."""

    def __init__(self, models: ModelRegistry, settings: Settings) -> None:
        self.models = models
        self.settings = settings
        self.adapters: dict[str, LoraAdapter] = {}
        self.created: dict[str, int] = {}

    def roots(self) -> list[Path]:
        """The directories ``MILLM_LORA_DIRS`` names."""
        value = self.settings[SETTING] or ""
        return [Path(part).expanduser() for part in value.split(os.pathsep) if part.strip()]

    def discover(self) -> None:
        """Every adapter in ``MILLM_LORA_DIRS``; one that cannot be served is logged and left out."""
        for root in self.roots():
            if not root.is_dir():
                log.warning("%s: %s is not a directory", SETTING, root)
                continue
            for child in sorted(root.iterdir()):
                if child.is_dir() and (child / CONFIG).is_file():
                    try:
                        self.add(child.name, child)
                    except MillmError as exc:
                        log.warning("LoRA adapter %s not served: %s", child, exc.message)

    def add(self, name: str, path: str | Path, base: ModelEntry | None = None) -> LoraAdapter:
        """Serve the adapter in ``path`` as ``name`` on ``base`` (None: the model its config names, else
        the start model). 400 for a name or directory that cannot serve, 409 for a name taken."""
        check_display_name(plain_name(name, "name"), "name")
        if ":" in name or name in self.models.entries:
            raise InvalidParameter(f"an adapter name may not contain ':' or be a model id: {name!r}", param="name")
        directory = Path(os.path.realpath(path))
        config = _read_config(directory)
        entry = base if base is not None else self._base_named(config)
        if LORA_ADAPTERS not in entry.spec.capabilities:
            raise InvalidParameter(
                f"the {entry.spec.name} engine of {entry.id!r} serves no LoRA adapters", param="path"
            )
        adapter = LoraAdapter(name=name, path=str(directory), base=entry.id)
        existing = self.adapters.get(name)
        if existing == adapter:
            return existing
        if existing is not None:
            raise AdapterExists(f"an adapter named {name!r} is served already (on {existing.base!r})", param="name")
        self.adapters[name] = adapter
        self.created[name] = int(time.time())
        return adapter

    def confined(self, path: str) -> Path:
        """The adapter directory ``path`` names inside ``MILLM_LORA_DIRS`` (400 outside, as SAE paths are)."""
        return confined_path(path, self.roots(), param="path", setting=SETTING)

    def remove(self, base: ModelEntry, name: str) -> LoraAdapter:
        """Stop serving ``name`` on ``base`` (404 when it serves there under no such name)."""
        adapter = self.adapters.get(name)
        if adapter is None or adapter.base != base.id:
            raise self._not_found(base, name)
        del self.adapters[name]
        self.created.pop(name, None)
        return adapter

    def on(self, base_id: str) -> list[LoraAdapter]:
        """The adapters served on model ``base_id``, by name."""
        return sorted((a for a in self.adapters.values() if a.base == base_id), key=lambda a: a.name)

    def resolve(self, name: str) -> tuple[ModelEntry, LoraAdapter | None]:
        """The model and adapter a request's ``model`` names.

        A model id (or alias) names the base model; ``"<base>:<adapter>"`` an adapter on it; an
        adapter's bare name the adapter on its base. Anything else is the registry's 404.
        """
        entry = self.models.entries.get(name)
        if entry is not None:
            return entry, None
        adapter = self.adapters.get(name)
        if adapter is not None and adapter.base in self.models.entries:
            return self.models.entries[adapter.base], adapter
        base_name, colon, adapter_name = name.rpartition(":")
        if colon and base_name:
            try:
                base = self.models.resolve(base_name)
            except MillmError:
                base = None  # not "<model>:<adapter>": the registry says what it is (a GGUF quantization tag)
            if base is not None and self.on(base.id):  # a model without adapters: the registry's own 404
                adapter = self.adapters.get(adapter_name)
                if adapter is None or adapter.base != base.id:
                    raise self._not_found(base, adapter_name)
                return base, adapter
        return self.models.resolve(name), None

    def _not_found(self, base: ModelEntry, name: str) -> ModelNotFound:
        served = ", ".join(repr(a.name) for a in self.on(base.id)) or "none"
        return ModelNotFound(f"model {base.id!r} has no LoRA adapter {name!r}; its adapters: {served}", param="model")

    def _base_named(self, config: dict) -> ModelEntry:
        """The model an adapter's ``base_model_name_or_path`` names (an id, a repository id or a path
        ending in an id), else the start model."""
        named = str(config.get("base_model_name_or_path") or "")
        entries = self.models.entries.values()
        for entry in entries:
            d = entry.descriptor
            if named and named in (entry.id, d.hf_id, d.repo):
                return entry
        real = os.path.realpath(named) if named else None
        for entry in entries:
            if real is not None and os.path.realpath(entry.descriptor.path) == real:
                return entry
        tail = Path(named).name
        for entry in entries:
            if tail and tail == entry.id:
                return entry
        start = self.models.start_model
        if start is None:
            raise InvalidParameter(f"no model here is the adapter's base {named!r}; name one", param="path")
        return start


def _read_config(directory: Path) -> dict:
    """The adapter's ``adapter_config.json``: a LoRA one (400 otherwise)."""
    try:
        config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InvalidParameter(f"{directory} holds no {CONFIG}: not a PEFT adapter", param="path") from None
    except (OSError, ValueError) as exc:
        raise InvalidParameter(f"{directory / CONFIG} cannot be read: {exc}", param="path") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise InvalidParameter(
            f"{directory} is not a LoRA adapter (peft_type {config.get('peft_type')!r})", param="path"
        )
    return config
