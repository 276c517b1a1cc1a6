"""A safetensors checkpoint assigned straight to its model, without ``from_pretrained``.

``from_pretrained`` builds the model on the meta device, then walks every tensor
through its conversion, sharding, offloading and initialisation machinery (a tenth
of a second and more of each start, for a checkpoint that needs none of it). Here
the model is built with weight initialisation switched off (its parameters are
left empty, which costs no memory, and its buffers computed by its own
``__init__``), and the checkpoint's memory-mapped tensors become its parameters
as they are, exactly as ``from_pretrained`` would leave them.

Only a checkpoint that needs nothing more is loaded this way: plain safetensors
files whose names, shapes and dtypes are the model's own (the tied weights left
out), no quantization, no remote code, and no buffer that ``from_pretrained``
would compute differently. Anything else returns None, and the caller uses
``from_pretrained``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import transformers

log = logging.getLogger("millm.engine.transformers")

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def load(folder: Path, config: Any, dtype: torch.dtype) -> Any | None:
    """The model of ``folder`` in ``dtype`` (eval mode, on the CPU), or None where ``from_pretrained`` is needed."""
    files = checkpoint_files(folder)
    if files is None or getattr(config, "quantization_config", None) or getattr(config, "auto_map", None):
        return None
    from transformers.initialization import no_init_weights

    with no_init_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(safetensors.torch.load_file(file))  # memory-mapped: nothing is read yet
    why = mismatch(model, state)
    if why is not None:
        log.info("loading %s through from_pretrained: %s", folder, why)
        return None
    model.load_state_dict(state, strict=False, assign=True)
    if model.all_tied_weights_keys:
        model.tie_weights()
    if model.can_generate() and hasattr(model, "adjust_generation_fn"):
        read_generation_config(model, folder)
    return model.eval()


def checkpoint_files(folder: Path) -> list[Path] | None:
    """The checkpoint's safetensors files (one, or the shards its index names); None for other formats."""
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    index = folder / INDEX_FILE
    if not index.is_file():
        return None
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    files = [folder / shard for shard in shards]
    return files if all(file.is_file() for file in files) else None


def mismatch(model: Any, state: dict[str, torch.Tensor]) -> str | None:
    """Why ``state`` cannot simply be assigned to ``model`` (None: it can)."""
    expected = model.state_dict()
    tied = dict(model.all_tied_weights_keys)  # target -> source
    missing = expected.keys() - state.keys()
    unexpected = state.keys() - expected.keys()
    if unexpected:
        return f"{len(unexpected)} tensors the model does not have (e.g. {min(unexpected)})"
    if missing != tied.keys() or any(source not in state for source in tied.values()):
        return "its tensors are not the model's own, less the tied ones"
    for name, tensor in state.items():
        own = expected[name]
        if tensor.shape != own.shape or tensor.dtype != own.dtype:
            return f"{name} is {tensor.dtype} {list(tensor.shape)}, the model's {own.dtype} {list(own.shape)}"
    for module in model.modules():
        # from_pretrained recomputes a rotary embedding's buffers with the rope function its __init__
        # used; any other non-persistent buffer it may compute otherwise.
        rotary = "RotaryEmbedding" in type(module).__name__ and hasattr(module, "original_inv_freq")
        if module._non_persistent_buffers_set and not rotary:
            return f"{type(module).__name__} holds buffers from_pretrained computes itself"
    return None


def read_generation_config(model: Any, folder: Path) -> None:
    """The checkpoint's generation settings, read by the same method ``from_pretrained`` calls."""
    model.adjust_generation_fn(
        generation_config=None,
        from_auto_class=True,
        from_pipeline=None,
        pretrained_model_name_or_path=str(folder),
        cache_dir=None,
        force_download=False,
        proxies=None,
        local_files_only=True,
        token=None,
        revision="main",
        subfolder="",
        trust_remote_code=None,
    )
