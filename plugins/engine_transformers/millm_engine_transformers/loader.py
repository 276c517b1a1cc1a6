"""Loading checkpoints: HF directories directly, .gguf files through a cached conversion.

A plain safetensors checkpoint is assigned straight to its model (``direct_load``);
anything else goes through ``from_pretrained``.

transformers dequantizes a .gguf file on every load (tens of seconds on a CPU).
The first load saves the result as a safetensors checkpoint in the cache
directory, keyed by the file's path, size and mtime; later loads read that.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

from millm_host.api import ModelDescriptor, save_atomically

from . import direct_load, small_batch

log = logging.getLogger("millm.engine.transformers")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def choose_device(setting: str) -> torch.device:
    if setting in ("", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def choose_dtype(setting: str, device: torch.device, config: Any) -> torch.dtype:
    if setting in ("", "auto"):
        if device.type == "cpu":
            return torch.float32
        stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        if isinstance(stored, str):
            stored = _DTYPES.get(stored)
        return stored if isinstance(stored, torch.dtype) else torch.float32
    try:
        return _DTYPES[setting]
    except KeyError:
        raise ValueError(f"MILLM_DTYPE={setting!r}: expected auto, float32, float16 or bfloat16") from None


def gguf_cache_dir(cache_root: Path, gguf_path: Path) -> Path:
    real = gguf_path.resolve()  # a symlink shares its target's conversion
    stat = real.stat()
    key = hashlib.sha256(f"{real}|{stat.st_size}|{int(stat.st_mtime)}".encode()).hexdigest()[:16]
    return cache_root / "transformers-gguf" / f"{real.stem}-{key}"


def convert_gguf(gguf_path: Path, target: Path, progress: Callable[[str], None]) -> None:
    """Dequantize a .gguf file once and save it as a float32 safetensors checkpoint."""
    progress(f"converting {gguf_path.name} (first load; cached afterwards in {target})")
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    progress("tokenizer read; dequantizing weights")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # save_pretrained refuses a model still marked as GGUF-quantized; it is plain float32 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "is_quantized"):
        model.is_quantized = False

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)

    save_atomically(target, save)  # another process may convert the same file at once
    progress("conversion saved")


def checkpoint_dir(descriptor: ModelDescriptor, cache_root: Path, progress: Callable[[str], None]) -> Path:
    """The HF checkpoint directory to load ``descriptor`` from (converting a .gguf once)."""
    path = Path(descriptor.path)
    if descriptor.format != "gguf":
        return path
    return converted_checkpoint(path, cache_root, progress)


def converted_checkpoint(gguf_path: Path, cache_root: Path, progress: Callable[[str], None] = lambda _: None) -> Path:
    """The float32 checkpoint of ``gguf_path`` under ``cache_root`` (converted first if not yet): what a load
    reads, and what tests compare a server with."""
    target = gguf_cache_dir(cache_root, gguf_path)
    if not (target / "config.json").is_file():
        convert_gguf(gguf_path, target, progress)
    else:
        progress(f"reading cached conversion {target}")
    return target


def load_model(
    descriptor: ModelDescriptor, settings: Any, progress: Callable[[str], None]
) -> tuple[Any, Any, torch.device, torch.dtype]:
    """(model, tokenizer, device, dtype), the model in eval mode on its device."""
    folder = checkpoint_dir(descriptor, settings.cache_dir, progress)
    device = choose_device(settings["MILLM_DEVICE"])
    config = transformers.AutoConfig.from_pretrained(folder)
    dtype = choose_dtype(settings["MILLM_DTYPE"], device, config)
    progress(f"reading the tokenizer ({dtype}, {device})")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    progress("reading the weights")
    model = direct_load.load(folder, config, dtype)
    if model is None:
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.to(device)
    model.eval()
    if device.type == "cpu" and dtype == torch.float32 and settings["MILLM_CPU_SMALL_BATCH_TUNING"]:
        progress("timing the weights' products for a few rows (MILLM_CPU_SMALL_BATCH_TUNING)")
        for line in small_batch.describe(
            small_batch.tune(model, settings["MILLM_BATCH_MAX_ROWS"], settings.cache_dir / "small-batch.json")
        ):
            progress(line)
    return model, tokenizer, device, dtype
