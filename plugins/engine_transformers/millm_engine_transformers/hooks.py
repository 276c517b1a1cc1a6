"""Installing millm LayerHooks as torch forward hooks, only for the call that asked."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from millm_host.api import HookRow, LayerHook


def decoder_layers(model: torch.nn.Module, n_layers: int | None) -> torch.nn.ModuleList:
    """The model's list of decoder layers (``model.model.layers`` for Llama-like models).

    Elsewhere, the first ``ModuleList`` of ``n_layers`` modules (None: a config that
    does not say, so only ``model.model.layers`` is found).
    """
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


Point = tuple[int, str]  # (layer, "resid_pre" | "resid_post")

#: Where a hook runs in a pass: (its row, the position of its row's first real token in this
#: pass, the columns of left padding before that token in this pass, the hook).
Entry = tuple[int, int, int, LayerHook]


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


class _Stage:
    """The hooks of one ``order`` at one point: each batched function once, then per-row callbacks."""

    __slots__ = ("batched", "single")

    def __init__(self) -> None:
        self.batched: dict[Callable[..., Any], list[HookRow]] = {}
        self.single: dict[int, tuple[list[LayerHook], int, int]] = {}  # row -> (callbacks, start, skip)


def _stages(entries: Sequence[Entry], continuous: bool) -> list[_Stage]:
    """``entries`` (in row order, each row's hooks in call order) as stages in ascending ``order``;
    ``continuous``: the passes are a continuous batch's (``HookRow.continuous``)."""
    by_order: dict[int, _Stage] = {}
    for index, start, skip, hook in entries:
        stage = by_order.get(hook.order)
        if stage is None:
            stage = by_order[hook.order] = _Stage()
        if hook.batched is not None:
            stage.batched.setdefault(hook.batched, []).append(HookRow(index, start, skip, hook, continuous))
        else:
            stage.single.setdefault(index, ([], start, skip))[0].append(hook)
    return [by_order[order] for order in sorted(by_order)]


def _run_stages(
    hidden: torch.Tensor, stages: Sequence[_Stage], failed: Callable[[int, Exception], None] | None
) -> torch.Tensor | None:
    """Run ``stages`` on ``hidden``; the replacement (None: nothing wrote).

    ``failed(row, exc)`` takes a callback's failure (for a batched function: once per row
    it was called for); without it, the failure propagates (the serial path).
    """
    current, replaced, owned = hidden, False, False
    whole = hidden.shape[0] == 1
    for stage in stages:
        for function, rows in stage.batched.items():
            try:
                result = function(current, rows)
            except Exception as exc:
                if failed is None:
                    raise
                for row in rows:
                    failed(row.index, exc)
                continue
            if result is not None:
                current, replaced, owned = result, True, False
        for index, (callbacks, start, skip) in stage.single.items():
            if skip >= current.shape[1]:  # all padding in this pass: nothing of its own to see
                continue
            try:
                if whole and skip == 0:  # its row is the whole pass (alone): no slicing, no copy
                    result = _run(callbacks, current, start)
                    if result is not None:
                        current, replaced, owned = result, True, False
                    continue
                result = _run(callbacks, current[index : index + 1, skip:], start)
            except Exception as exc:
                if failed is None:
                    raise
                failed(index, exc)
                continue
            if result is not None:
                if not owned:
                    current, owned = current.clone(), True
                current[index : index + 1, skip:] = result
                replaced = True
    return current if replaced else None


def _run(callbacks: Sequence[LayerHook], hidden: torch.Tensor, start: int) -> torch.Tensor | None:
    replaced = None
    for hook in callbacks:
        result = hook.callback(hidden, start)
        if result is not None:
            hidden = replaced = result
    return replaced


def install(layers: torch.nn.ModuleList, hooks: Sequence[LayerHook], position: Position) -> list[Any]:
    """Register one torch hook per hooked point for a pass of one sequence; return the handles to remove.

    A batched hook gets that sequence as a batch of one (``HookRow(0, start, 0, hook)``).
    """
    handles = []
    for point, group in grouped(hooks, len(layers)).items():
        if not any(hook.batched is not None for hook in group):
            run = _serial(group, position)
        else:
            run = _serial_batched(group, position)
        handles.append(_register(layers, point, run))
    return handles


def _serial(group: Sequence[LayerHook], position: Position) -> Callable[[torch.Tensor], torch.Tensor | None]:
    return lambda hidden: _run(group, hidden, position.start)


def _serial_batched(group: Sequence[LayerHook], position: Position) -> Callable[[torch.Tensor], torch.Tensor | None]:
    def run(hidden: torch.Tensor) -> torch.Tensor | None:
        start = position.start
        entries = [(index, start, 0, hook) for index in range(hidden.shape[0]) for hook in group]
        return _run_stages(hidden, _stages(entries, continuous=False), None)

    return run


#: One row's hooks at each point, the position of its first real token in this pass, and how
#: many columns of left padding come before that token in this pass (hidden from its callbacks).
RowHooks = tuple[Mapping[Point, Sequence[LayerHook]], int, int]


def install_rows(
    layers: torch.nn.ModuleList, rows: Sequence[RowHooks | None], failed: Callable[[int, Exception], None]
) -> list[Any]:
    """Hooks for a batched pass: the row -> request map of each hooked point.

    A per-row callback sees only its own row, ``[1, seq, d]``, as alone, its left
    padding cut off (a row all padding in this pass is not called). A batched function
    is called once with the whole batch and a ``HookRow`` for each row whose hook carries
    it. Rows without hooks at a point cost nothing there; a point no row hooks gets no
    torch hook at all. A callback that raises fails its row only (``failed(row, exc)``);
    a batched function that raises fails each row it was called for.
    """
    at: dict[Point, list[Entry]] = defaultdict(list)
    for index, row in enumerate(rows):
        if row is not None:
            groups, start, skip = row
            for point, group in groups.items():
                at[point].extend((index, start, skip, hook) for hook in group)
    return [
        _register(layers, point, _batch_run(_stages(entries, continuous=True), failed)) for point, entries in at.items()
    ]


def _batch_run(
    stages: Sequence[_Stage], failed: Callable[[int, Exception], None]
) -> Callable[[torch.Tensor], torch.Tensor | None]:
    return lambda hidden: _run_stages(hidden, stages, failed)


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
