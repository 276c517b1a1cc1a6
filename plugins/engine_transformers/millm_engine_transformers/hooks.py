"""Installing millm LayerHooks as torch forward hooks, only for the call that asked."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from millm_host.api import LayerHook


def decoder_layers(model: torch.nn.Module, n_layers: int) -> torch.nn.ModuleList:
    """The model's list of decoder layers (``model.model.layers`` for Llama-like models)."""
    inner = getattr(model, "model", None)
    if inner is not None and isinstance(getattr(inner, "layers", None), torch.nn.ModuleList):
        return inner.layers
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return module
    raise ValueError("cannot find the decoder layers of this model")


class Position:
    """The absolute position of the first row of the current forward pass."""

    __slots__ = ("start",)

    def __init__(self) -> None:
        self.start = 0


def _run(callbacks: Sequence[LayerHook], hidden: torch.Tensor, position: Position) -> torch.Tensor | None:
    replaced = None
    for hook in callbacks:
        result = hook.callback(hidden, position.start)
        if result is not None:
            hidden = replaced = result
    return replaced


def install(layers: torch.nn.ModuleList, hooks: Sequence[LayerHook], position: Position) -> list[Any]:
    """Register one torch hook per hooked point; return the handles to remove."""
    groups: dict[tuple[int, str], list[LayerHook]] = defaultdict(list)
    for hook in hooks:
        if not 0 <= hook.layer < len(layers):
            raise ValueError(f"layer {hook.layer} does not exist (the model has {len(layers)})")
        groups[(hook.layer, hook.point)].append(hook)
    handles = []
    for (layer, point), group in groups.items():
        ordered = sorted(group, key=lambda h: h.order)  # stable: ties keep registration order
        module = layers[layer]
        if point == "resid_post":
            handles.append(module.register_forward_hook(_post_hook(ordered, position)))
        elif point == "resid_pre":
            handles.append(module.register_forward_pre_hook(_pre_hook(ordered, position), with_kwargs=True))
        else:
            raise ValueError(f"unknown hook point {point!r}")
    return handles


def _post_hook(callbacks: Sequence[LayerHook], position: Position):
    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        replaced = _run(callbacks, hidden, position)
        if replaced is None:
            return None
        return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

    return hook


def _pre_hook(callbacks: Sequence[LayerHook], position: Position):
    def hook(module, args, kwargs):
        if args:
            replaced = _run(callbacks, args[0], position)
            return None if replaced is None else ((replaced, *args[1:]), kwargs)
        replaced = _run(callbacks, kwargs["hidden_states"], position)
        if replaced is None:
            return None
        return args, {**kwargs, "hidden_states": replaced}

    return hook


@contextmanager
def installed(layers: torch.nn.ModuleList, hooks: Sequence[LayerHook], position: Position) -> Iterator[None]:
    """``hooks`` installed for the ``with`` block (nothing at all when there are none)."""
    handles = install(layers, hooks, position) if hooks else []
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
