"""Float32 scoring: a float32 copy of the served model for one request, then released.

The served weights are never cast or changed. The copy is built from them tensor
by tensor (its structure deep-copied, its parameters and buffers cast on the
target device), so it needs 4 bytes per parameter and nothing more. A model
loaded in float32 is scored as it is. Every refusal is a
``ScoringPrecisionUnavailable`` carrying its reason.
"""

from __future__ import annotations

import copy
import gc
import itertools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from millm_host.api import ScoringPrecisionUnavailable, available_memory

MIB = 2**20
T = TypeVar("T")


def score_in_float32(
    model: Any,
    device: torch.device,
    dtype: torch.dtype,
    model_format: str,
    device_setting: str,
    headroom_mb: int,
    score: Callable[[Any, torch.device], T],
) -> T:
    """``score(model, device)`` on the served model if it is float32, else on a float32 copy.

    The copy lives only inside this call: it is released (and a GPU's cache
    emptied) before the result is returned.
    """
    if dtype == torch.float32:
        return score(model, device)
    refuse_uncastable(model, model_format)
    target = copy_device(device_setting, device)
    need = copy_bytes(model)
    place = fit(target, device, need, headroom_mb * MIB, device_setting)
    try:
        return _score_copy(model, place, need, score)
    finally:
        gc.collect()
        if place.type == "cuda":
            torch.cuda.empty_cache()


def _score_copy(model: Any, place: torch.device, need: int, score: Callable[[Any, torch.device], T]) -> T:
    try:
        replica = build_copy(model, place)
    except (torch.OutOfMemoryError, MemoryError) as exc:
        raise _memory(f"allocating the float32 copy ({need / MIB:.0f} MiB) on {place} failed: {exc}") from None
    except Exception as exc:
        if _is_cpu_oom(exc):
            raise _memory(f"allocating the float32 copy on {place} failed: {exc}") from None
        raise _uncastable(f"the model cannot be rebuilt as a float32 copy: {type(exc).__name__}: {exc}") from None
    try:
        return score(replica, place)
    except (torch.OutOfMemoryError, MemoryError) as exc:
        raise _memory(f"the float32 forward pass ran out of memory on {place}: {exc}") from None
    except RuntimeError as exc:
        if _is_cpu_oom(exc):
            raise _memory(f"the float32 forward pass ran out of memory on {place}: {exc}") from None
        raise


def refuse_uncastable(model: Any, model_format: str) -> None:
    """GGUF, quantized and integer-parameter models have no faithful float32 copy."""
    if model_format == "gguf":
        raise _uncastable("the model was dequantized from a GGUF file")
    quantization = getattr(model.config, "quantization_config", None)
    if getattr(model, "hf_quantizer", None) is not None or getattr(model, "is_quantized", False) or quantization:
        raise _uncastable("the model is quantized")
    integer = next((name for name, p in model.named_parameters() if not p.is_floating_point()), None)
    if integer is not None:
        raise _uncastable(f"the model has integer parameters ({integer})")


def copy_device(setting: str, model_device: torch.device) -> torch.device | None:
    """Where SCORING_FLOAT32_DEVICE puts the copy; None for auto (decided by what fits)."""
    value = (setting or "auto").strip().lower()
    if value == "auto":
        return None
    if value == "cpu":
        return torch.device("cpu")
    try:
        target = torch.device(value)
    except RuntimeError:
        target = None
    if target is None or target.type != "cuda":
        raise _device(f"SCORING_FLOAT32_DEVICE={setting!r} is not auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise _device(f"SCORING_FLOAT32_DEVICE={setting} names a GPU, and this server sees none")
    if model_device.type != "cuda":
        raise _device(f"SCORING_FLOAT32_DEVICE={setting} while the model is on the {model_device.type}")
    if target.index is None:
        return model_device
    if target.index >= torch.cuda.device_count():
        raise _device(f"SCORING_FLOAT32_DEVICE={setting}: this server sees {torch.cuda.device_count()} GPU(s)")
    return target


def copy_bytes(model: Any) -> int:
    """Bytes of a float32 copy: 4 per parameter and floating buffer element (tied weights once)."""
    seen: set[int] = set()
    total = 0
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * (4 if tensor.is_floating_point() else tensor.element_size())
    return total


def fit(
    target: torch.device | None, model_device: torch.device, need: int, headroom: int, setting: str
) -> torch.device:
    """The device the copy goes to, with ``headroom`` to spare, or a ``memory`` refusal."""
    if target is not None:
        candidates = [target]
    elif model_device.type == "cuda":
        candidates = [model_device, torch.device("cpu")]  # auto: the model's GPU, then the CPU
    else:
        candidates = [torch.device("cpu")]
    tried = []
    for place in candidates:
        free = free_bytes(place)
        if free is None or need + headroom <= free:
            return place
        tried.append(f"{place}: {free / MIB:.0f} MiB free")
    raise _memory(
        f"the float32 copy needs {need / MIB:.0f} MiB plus {headroom / MIB:.0f} MiB of headroom "
        f"(SCORING_FLOAT32_HEADROOM_MB); {'; '.join(tried)} (SCORING_FLOAT32_DEVICE={setting or 'auto'})"
    )


def free_bytes(place: torch.device) -> int | None:
    """Memory free for the copy on ``place`` (None: unknown)."""
    if place.type == "cuda":
        return torch.cuda.mem_get_info(place)[0]
    return available_memory()


def build_copy(model: Any, place: torch.device) -> Any:
    """A float32 copy of ``model`` on ``place``; the served model is only read."""
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if id(tensor) in memo:
            continue
        dtype = torch.float32 if tensor.is_floating_point() else tensor.dtype
        data = tensor.detach().to(device=place, dtype=dtype, copy=True)
        memo[id(tensor)] = (
            torch.nn.Parameter(data, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else data
        )
    replica = copy.deepcopy(model, memo)  # the structure; tensors come from the memo
    replica.config.dtype = torch.float32
    return replica.eval()


def _is_cpu_oom(exc: BaseException) -> bool:
    return "can't allocate memory" in str(exc) or "not enough memory" in str(exc)


def _memory(detail: str) -> ScoringPrecisionUnavailable:
    return ScoringPrecisionUnavailable("memory", detail)


def _device(detail: str) -> ScoringPrecisionUnavailable:
    return ScoringPrecisionUnavailable("device", detail)


def _uncastable(detail: str) -> ScoringPrecisionUnavailable:
    return ScoringPrecisionUnavailable("model_not_float32_castable", detail)
