"""Installing millm LayerHooks as torch forward hooks, only for the call that asked."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
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


def _run(callbacks: Sequence[LayerHook], hidden: torch.Tensor, start: int) -> torch.Tensor | None:
    replaced = None
    for hook in callbacks:
        result = hook.callback(hidden, start)
        if result is not None:
            hidden = replaced = result
    return replaced


Point = tuple[int, str]  # (layer, "resid_pre" | "resid_post")


def grouped(hooks: Sequence[LayerHook], n_layers: int) -> dict[Point, list[LayerHook]]:
    """``hooks`` by the point they hook, each group in call order; a layer that does not exist is refused."""
    groups: dict[Point, list[LayerHook]] = defaultdict(list)
    for hook in hooks:
        if not 0 <= hook.layer < n_layers:
            raise ValueError(f"layer {hook.layer} does not exist (the model has {n_layers})")
        if hook.point not in ("resid_pre", "resid_post"):
            raise ValueError(f"unknown hook point {hook.point!r}")
        groups[(hook.layer, hook.point)].append(hook)
    return {point: sorted(group, key=lambda h: h.order) for point, group in groups.items()}  # stable sort


def install(layers: torch.nn.ModuleList, hooks: Sequence[LayerHook], position: Position) -> list[Any]:
    """Register one torch hook per hooked point; return the handles to remove."""
    return [
        _register(layers, point, lambda hidden, group=group: _run(group, hidden, position.start))
        for point, group in grouped(hooks, len(layers)).items()
    ]


#: One row's hooks at each point, the position of its first real token in this pass, and how
#: many columns of left padding come before that token in this pass (hidden from its callbacks).
RowHooks = tuple[Mapping[Point, Sequence[LayerHook]], int, int]


def install_rows(
    layers: torch.nn.ModuleList, rows: Sequence[RowHooks | None], failed: Callable[[int, Exception], None]
) -> list[Any]:
    """Hooks for a batched pass: each row's callbacks see only its own row, ``[1, seq, d]``, as alone.

    Its left padding is cut off (a row all padding in this pass is not called).
    Rows without hooks at a point cost nothing there; a point no row hooks gets no
    torch hook at all. A callback that raises fails its row only (``failed(row, exc)``).
    """
    at: dict[Point, list[tuple[int, Sequence[LayerHook], int, int]]] = defaultdict(list)
    for index, row in enumerate(rows):
        if row is not None:
            groups, start, skip = row
            for point, group in groups.items():
                at[point].append((index, group, start, skip))
    return [_register(layers, point, _per_row(entries, failed)) for point, entries in at.items()]


def _per_row(
    entries: Sequence[tuple[int, Sequence[LayerHook], int, int]], failed: Callable[[int, Exception], None]
) -> Callable[[torch.Tensor], torch.Tensor | None]:
    def run(hidden: torch.Tensor) -> torch.Tensor | None:
        out = None
        for index, group, start, skip in entries:
            if skip >= hidden.shape[1]:
                continue
            try:
                replaced = _run(group, hidden[index : index + 1, skip:], start)
            except Exception as exc:
                failed(index, exc)
                continue
            if replaced is not None:
                if out is None:
                    out = hidden.clone()
                out[index : index + 1, skip:] = replaced
        return out

    return run


def _register(layers: torch.nn.ModuleList, point: Point, run: Callable[[torch.Tensor], torch.Tensor | None]) -> Any:
    layer, name = point
    module = layers[layer]
    if name == "resid_post":
        return module.register_forward_hook(_post_hook(run))
    return module.register_forward_pre_hook(_pre_hook(run), with_kwargs=True)


def _post_hook(run: Callable[[torch.Tensor], torch.Tensor | None]):
    def hook(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        replaced = run(hidden)
        if replaced is None:
            return None
        return (replaced, *output[1:]) if isinstance(output, tuple) else replaced

    return hook


def _pre_hook(run: Callable[[torch.Tensor], torch.Tensor | None]):
    def hook(module, args, kwargs):
        if args:
            replaced = run(args[0])
            return None if replaced is None else ((replaced, *args[1:]), kwargs)
        replaced = run(kwargs["hidden_states"])
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
