"""PEFT LoRA adapters on the resident model: injected in place, chosen per row of each pass.

peft's ``inject_adapter_in_model`` replaces each targeted ``nn.Linear`` inside the decoder
layers by a ``LoraLayer`` that wraps it: the model, its ``layers`` ModuleList and every
decoder layer stay the same objects, so the layer hooks (steering writes, probe reads) sit
where they sat before. Which adapter each row of a pass uses is peft's mixed-batch inference
(``adapter_names``, ``"__base__"`` for a row without one). ``PeftModel.forward`` hands those
names to each LoRA layer through forward pre-hooks registered for the call; calling the model's
own forward (with its KV cache, as the batch does) skips that, so here each LoRA layer gets one
pre-hook for good, the ``Selection``, which hands it the names the engine set for the pass.
A pass the engine named nothing for runs every row on the base weights, so an adapter loaded
for one request never leaks into another's pass (peft would apply its "active" adapter).

Every method but ``acquire``/``release`` runs on the model's thread (between batch steps).
"""

from __future__ import annotations

import collections
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from millm_host.api import InvalidParameter, LoraAdapter, MillmError

#: peft's name for "no adapter" in ``adapter_names``.
BASE = "__base__"


class AdapterBusy(MillmError):
    """An adapter in use by running generations cannot be replaced by another directory under its name."""

    status, code = 409, "adapter_busy"


class Selection:
    """Which adapter each row of the next pass uses: the pre-hook of every LoRA layer (model thread only).

    Shared, never copied: the float32 scoring copy's LoRA layers read the same selection
    (``copy.deepcopy`` keeps it), so the served adapter applies to the copy too.
    """

    def __init__(self) -> None:
        #: One adapter for every row (a str), one per row (None: the base), or None: every row on the base.
        self.names: str | Sequence[str | None] | None = None

    def __deepcopy__(self, memo: dict) -> Selection:
        return self

    def __call__(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        x = args[0] if args else kwargs["x"]
        rows, names = x.shape[0], self.names
        if names is None or isinstance(names, str):
            kwargs["adapter_names"] = [names or BASE] * rows
        else:
            if len(names) != rows:
                raise RuntimeError(f"{len(names)} adapter names for a pass of {rows} rows")
            kwargs["adapter_names"] = [name or BASE for name in names]
        return args, kwargs

    @contextmanager
    def rows(self, names: str | Sequence[str | None] | None) -> Iterator[None]:
        """The passes inside the block use ``names`` (one per row, or one for all); the base after it."""
        if names is not None and not isinstance(names, str) and not any(names):
            names = None  # no row adapted: every LoRA layer's base path
        self.names = names
        try:
            yield
        finally:
            self.names = None


class LoraAdapters:
    """The adapters loaded into one model, by name, and the generations using each."""

    def __init__(self, model: Any, device: torch.device, later: Callable[[Callable[[], None]], Any]) -> None:
        self.model = model
        self.device = device
        self.selection = Selection()
        #: Runs a function on the model's thread soon (a deferred unload, from the thread a generation ended on).
        self._later = later
        self.paths: dict[str, str] = {}  # loaded name -> its directory
        self._hooked: dict[int, Any] = {}  # id(LoRA layer) -> its selection hook's handle
        self._lock = threading.Lock()  # guards the two below (request threads and the model's)
        self._users: collections.Counter[str] = collections.Counter()
        self._doomed: set[str] = set()  # unloaded while in use: freed when the last user ends
        #: Called (model thread) when an adapter's weights leave: a name loaded again later may be other weights,
        #: so what was computed under the name (the prefix cache) goes too.
        self.on_delete: Callable[[], None] | None = None

    def loaded(self, adapter: LoraAdapter) -> bool:
        """Its weights are in the model (an unload may wait for the generations using it: they keep them)."""
        return self.paths.get(adapter.name) == adapter.path

    def load(self, adapter: LoraAdapter, param: str = "path") -> None:
        """Inject ``adapter`` and read its weights (model thread); nothing when it is loaded already.

        Files the model cannot take are a 400 naming ``param``: the route's ``path``, a request's ``model``."""
        name, path = adapter.name, adapter.path
        with self._lock:
            if self.paths.get(name) == path:
                self._doomed.discard(name)  # added again before its last user ended: it stays
                return
            if name in self.paths:
                if self._users[name]:
                    raise AdapterBusy(f"adapter {name!r} from {self.paths[name]} is still generating", param="name")
                self._delete(name)
        from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
        from peft.utils import load_peft_weights

        try:
            config = LoraConfig.from_pretrained(path)
            config.inference_mode = True
            with warnings.catch_warnings():  # a second adapter is what this does on purpose
                warnings.filterwarnings("ignore", message="Already found a `peft_config`")
                inject_adapter_in_model(config, self.model, adapter_name=name)
            result = set_peft_model_state_dict(self.model, load_peft_weights(path, device=str(self.device)), name)
            unexpected = [key for key in getattr(result, "unexpected_keys", ()) if "lora_" in key]
            if unexpected:
                raise ValueError(f"weights for modules this model lacks: {', '.join(unexpected[:5])}")
        except Exception as exc:
            self._delete(name)
            raise InvalidParameter(
                f"the LoRA adapter in {path} cannot be served on this model: {type(exc).__name__}: {exc}", param=param
            ) from None
        self.model.eval()
        self.paths[name] = path
        self._hook()

    def unload(self, name: str) -> None:
        """Free ``name``'s weights (model thread), or once its last generation ends."""
        with self._lock:
            if name not in self.paths:
                return
            if self._users[name]:
                self._doomed.add(name)
                return
            self._delete(name)

    def acquire(self, name: str) -> None:
        """A generation starts using ``name`` (any thread): its weights stay until ``release``."""
        with self._lock:
            self._users[name] += 1

    def release(self, name: str) -> None:
        """The generation ended; the last one frees an adapter unloaded meanwhile (on the model thread)."""
        with self._lock:
            self._users[name] -= 1
            if self._users[name] > 0 or name not in self._doomed:
                return
            del self._users[name]
        self._later(lambda: self.unload(name) if name in self._doomed else None)

    def _delete(self, name: str) -> None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                module.delete_adapter(name)
        configs = getattr(self.model, "peft_config", None)
        if isinstance(configs, dict):
            configs.pop(name, None)
        self.paths.pop(name, None)
        self._doomed.discard(name)
        if self.on_delete is not None:
            self.on_delete()

    def _hook(self) -> None:
        """The selection as a pre-hook of every LoRA layer (and every module peft wraps for an adapter)."""
        from peft.tuners.lora import LoraLayer
        from peft.utils.other import AuxiliaryTrainingWrapper

        for module in self.model.modules():
            if isinstance(module, (LoraLayer, AuxiliaryTrainingWrapper)) and id(module) not in self._hooked:
                self._hooked[id(module)] = module.register_forward_pre_hook(self.selection, with_kwargs=True)


class HeldTokens:
    """A generation's tokens that hold its adapter's weights until the generation ends (closed or done)."""

    def __init__(self, tokens: Any, adapters: LoraAdapters, name: str) -> None:
        self._tokens, self._adapters, self._name = tokens, adapters, name
        self._held = True

    def __iter__(self) -> HeldTokens:
        return self

    def __next__(self) -> int:
        try:
            return next(self._tokens)
        except BaseException:
            self._release()
            raise

    def close(self) -> None:
        try:
            self._tokens.close()
        finally:
            self._release()

    @property
    def cached_tokens(self) -> int | None:
        return getattr(self._tokens, "cached_tokens", None)

    def _release(self) -> None:
        if self._held:
            self._held = False
            self._adapters.release(self._name)
