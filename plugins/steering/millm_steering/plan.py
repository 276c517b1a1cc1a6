"""One request's steering, as layer hooks: the write callbacks and what they applied.

Each steered attachment gets one write hook (``ORDER_WRITE_STEERING``) whose
callback adds a precomputed vector ``Σ clamp(s)·W_dec[i]`` (in the model's dtype,
on its device) to the residual at every position: one tensor add per forward.
In a continuous batch the hooks of all steered rows share one batched function
(``steer_rows``): one add per point and pass for the whole batch, each row its own
vector and unsteered rows a zero (they carry no hook: they add no work). The hook also carries that vector (``LayerHook.vector``), so an engine without
callbacks (GGUF: llama.cpp control vectors) applies it for the whole generation.

A request that carries its own set (a profile, an inline set, ``features: []``)
is *frozen*: its hooks apply that set to the end, whatever an operator changes
meanwhile. A request that runs on the server's state (optionally dialled) is
*live*: when the epoch moves, its hooks re-read the state at their next call,
so the remaining tokens see the operator's values. Either way the header says
what the hooks applied last, flagged ``changed`` when the epoch moved.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from millm_host.api import ORDER_WRITE_STEERING, STEERED, HookRow, LayerHook

from .resolve import Entry, Served
from .state import Snapshot, SteeringState

SlotKey = tuple[str, str, int]  # (owner, sae_id, layer)


class Slot:
    """One write hook: the entry it applies now (None: nothing) and its vector."""

    __slots__ = ("key", "layer", "point", "entry", "delta")

    def __init__(self, entry: Entry, dtype: Any) -> None:
        self.key = entry.slot
        self.layer = entry.attachment.layer
        self.point = entry.attachment.point
        self.entry: Entry | None = None
        self.delta: Any = None
        self.apply(entry, dtype)

    def apply(self, entry: Entry | None, dtype: Any) -> None:
        if entry == self.entry:  # an epoch move elsewhere: this hook's vector still holds
            return
        self.entry = entry
        self.delta = None if entry is None else entry.attachment.sae.steering_vector(entry.applied.values, dtype)


class Plan:
    """A request's write hooks and the state they were built from."""

    def __init__(
        self,
        state: SteeringState,
        snap: Snapshot,
        served: Served,
        dtype: Any,
        refresh: Callable[[Snapshot], Served] | None = None,
    ) -> None:
        self.state = state
        self.start_epoch = self.seen_epoch = snap.epoch
        self.dtype = dtype
        self._refresh = refresh
        self.problem = served.problem  # an ``unknown`` reason for the header, or None
        self.slots: dict[SlotKey, Slot] = {e.slot: Slot(e, dtype) for e in served.entries}

    @property
    def live(self) -> bool:
        return self._refresh is not None

    def hooks(self) -> list[LayerHook]:
        return [
            LayerHook(
                slot.layer,
                slot.point,
                self._callback(slot),
                ORDER_WRITE_STEERING,
                owner="steering",
                vector=self._vector(slot),
                batched=steer_rows,
                state=(self, slot),
                prompt_key=self._prompt_key(slot),
                variant=STEERED,  # with_unsteered: the unsteered reply's rows go without it
            )
            for slot in self.slots.values()
        ]

    def _prompt_key(self, slot: Slot) -> Callable[[], str]:
        """What the slot adds now, as a prefix cache key: a prompt computed under the same values is reused."""

        def key() -> str:
            self.delta(slot)  # a live plan re-reads a state whose epoch moved
            entry = slot.entry
            return "steering:none" if entry is None else f"steering:{entry.hash}"

        return key

    def _vector(self, slot: Slot) -> Callable[[], Any]:
        """The slot's vector now, for an engine that applies it itself (llama.cpp control vectors,
        read once when generation starts: what it read is what the header reports)."""

        def vector() -> Any:
            if self.live and self.state.epoch != self.seen_epoch:
                self.refresh()
            return slot.delta

        return vector

    def delta(self, slot: Slot) -> Any:
        """What ``slot`` adds now (None: nothing), after re-reading a live state whose epoch moved."""
        if self.live and self.state.epoch != self.seen_epoch:
            self.refresh()
        return slot.delta

    def _callback(self, slot: Slot) -> Callable[[Any, int], Any]:
        if not self.live:
            delta = slot.delta

            def steer(hidden: Any, start: int) -> Any:
                return hidden + delta

            return steer
        state = self.state

        def steer_live(hidden: Any, start: int) -> Any:
            if state.epoch != self.seen_epoch:
                self.refresh()
            return None if slot.delta is None else hidden + slot.delta

        return steer_live

    def refresh(self) -> None:
        """The epoch moved: re-read the state onto the hooks this request installed."""
        assert self._refresh is not None
        snap = self.state.snapshot()
        self.seen_epoch = snap.epoch
        served = self._refresh(snap)
        self.problem = served.problem
        current = {e.slot: e for e in served.entries}
        for key, slot in self.slots.items():
            slot.apply(current.get(key), self.dtype)

    def applied(self) -> list[Entry]:
        """The entries the hooks apply now (after the last refresh)."""
        return [slot.entry for slot in self.slots.values() if slot.entry is not None]

    def changed(self) -> bool:
        return self.state.epoch != self.start_epoch


class _Composed:
    """The last ``[batch, 1, d]`` stack of row vectors ``steer_rows`` built, reused while the same."""

    __slots__ = ("key", "deltas", "tensor")

    def __init__(self) -> None:
        self.key: tuple[Any, ...] = ()
        self.deltas: tuple[Any, ...] = ()
        self.tensor: Any = None


_local = threading.local()  # each engine thread its own stacks, by (layer, point, batch size)


def steer_rows(hidden: Any, rows: Sequence[HookRow]) -> Any:
    """Every steered row of a batched pass its own vector, in one add: ``LayerHook.batched``.

    ``hidden`` is ``[batch, seq, d]``; a row not listed adds zero. A row's left padding
    gets its vector too: padding is masked out of attention, so no real token reads it.
    The stack is rebuilt only when the rows or their vectors change (a row joins or
    leaves, a live change), so a decode step usually pays the add alone.
    """
    import torch

    picked = []
    for row in rows:
        plan, slot = row.hook.state
        delta = plan.delta(slot)
        if delta is not None:
            picked.append((row.index, delta))
    if not picked:
        return None
    batch = hidden.shape[0]
    if batch == 1 and len(picked) == 1:  # alone: the serial add
        return hidden + picked[0][1]
    first = rows[0].hook
    slot_key = (first.layer, first.point, batch)
    stacks = getattr(_local, "stacks", None)
    if stacks is None:
        stacks = _local.stacks = {}
    composed = stacks.get(slot_key)
    if composed is None:
        composed = stacks[slot_key] = _Composed()
    key = tuple(index for index, _ in picked)
    deltas = tuple(delta for _, delta in picked)
    if (
        composed.key != key
        or len(composed.deltas) != len(deltas)
        or any(a is not b for a, b in zip(composed.deltas, deltas, strict=True))
    ):
        stacked = torch.zeros((batch, 1, hidden.shape[-1]), dtype=hidden.dtype, device=hidden.device)
        index = torch.tensor(key, device=hidden.device)
        stacked.index_add_(0, index, torch.stack(deltas).to(hidden.dtype).unsqueeze(1))
        composed.key, composed.deltas, composed.tensor = key, deltas, stacked
    return hidden + composed.tensor
