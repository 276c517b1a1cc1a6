"""Gathering the residual rows probes read, on the device, during the forward passes.

One read hook per residual point (``ORDER_READ_PRE_STEERING``: probes see the
residual before any steering write at that point). Each forward pass copies its
rows into a buffer sized once for the whole request, so nothing leaves the
device until scoring, which happens once, after the last pass. In a continuous
batch one batched call per point and pass (``capture_rows``) serves the armed
rows of every request in the batch, each into its own buffer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from millm_host.api import ORDER_READ_PRE_STEERING, READS_PROMPT, HookRow, LayerHook

from .bank import Point

OWNER = "probes"


class _Point:
    """One point's rows: the buffer and how far the passes have filled it."""

    __slots__ = ("buffer", "filled")

    def __init__(self) -> None:
        self.buffer: Any = None
        self.filled = 0


class Capture:
    """Residual rows per point for one sequence: ``rows[point][:positions]``."""

    def __init__(self, points: Iterable[Point], capacity: int) -> None:
        self.points = list(points)
        self.capacity = max(1, capacity)
        self._slots = {point: _Point() for point in self.points}
        self.passes = 0
        # The most sequences one pass of a continuous batch held (this one included); 0 when no pass
        # was a continuous batch's (served alone: the serial path, ``HookRow.continuous`` False).
        self.batch_rows = 0
        self.seconds = 0.0  # time spent inside the callbacks
        self.prompt_seconds = 0.0  # of which in the first pass (the prompt's)
        self.cpu_seconds = 0.0  # the same on the CPU: what another process's load does not inflate
        self.prompt_cpu_seconds = 0.0

    def hooks(self) -> list[LayerHook]:
        return [
            LayerHook(
                layer,
                point,
                self._callback(self._slots[(layer, point)], first=i == 0),
                ORDER_READ_PRE_STEERING,
                OWNER,
                batched=capture_rows,
                state=(self, self._slots[(layer, point)], i == 0),
                prompt_key=READS_PROMPT,  # a reused prompt's positions are replayed to it
            )
            for i, (layer, point) in enumerate(self.points)
        ]

    def _callback(self, slot: _Point, first: bool):
        # An engine that calls per-row callbacks (not ``batched``) runs this once per pass and point.
        clock, cpu = time.perf_counter, time.thread_time

        def read(hidden: Any, start: int) -> None:
            began, began_cpu = clock(), cpu()
            self._store(slot, hidden[0], start, first)
            self._took(clock() - began, cpu() - began_cpu)
            return None

        return read

    def _store(self, slot: _Point, rows: Any, start: int, first: bool) -> None:
        """Copy one pass's ``rows`` ``[seq, d]`` (from position ``start``) into ``slot``'s buffer, on the device."""
        end = start + rows.shape[0]
        buffer = slot.buffer
        if buffer is None or end > buffer.shape[0]:
            buffer = self._grow(slot, rows, end)
        buffer[start:end].copy_(rows)
        if end > slot.filled:
            slot.filled = end
        if first:
            self.passes += 1

    def _took(self, seconds: float, cpu_seconds: float) -> None:
        self.seconds += seconds
        self.cpu_seconds += cpu_seconds
        if self.passes == 1:
            self.prompt_seconds += seconds
            self.prompt_cpu_seconds += cpu_seconds

    def _grow(self, slot: _Point, rows: Any, end: int) -> Any:
        import torch

        old = slot.buffer
        size = max(self.capacity, end)
        buffer = torch.empty((size, rows.shape[-1]), dtype=rows.dtype, device=rows.device)
        if old is not None:
            buffer[: old.shape[0]].copy_(old)
        slot.buffer = buffer
        return buffer

    @property
    def positions(self) -> int:
        """Positions whose residual every point holds (a pass cut off half-way counts at none)."""
        if not self._slots or any(slot.buffer is None for slot in self._slots.values()):
            return 0
        return min(slot.filled for slot in self._slots.values())

    def rows(self) -> dict[Point, Any]:
        positions = self.positions
        return {point: slot.buffer[:positions] for point, slot in self._slots.items() if slot.buffer is not None}


def capture_rows(hidden: Any, rows: Sequence[HookRow]) -> None:
    """Every armed request's rows of a batched pass into its buffer: ``LayerHook.batched``.

    One call per point and pass for the whole batch (rows without armed probes are not
    listed and cost nothing); each request's real columns ``hidden[index, skip:]`` are
    copied into its buffer on the device, so nothing leaves the device until scoring.
    The call's time is shared out among its requests.
    """
    began, began_cpu = time.perf_counter(), time.thread_time()
    captures = []
    sequences = hidden.shape[0]
    for row in rows:
        capture, slot, first = row.hook.state
        if row.continuous:
            capture.batch_rows = max(capture.batch_rows, sequences)
        part = hidden[row.index, row.skip :]
        if part.shape[0]:
            capture._store(slot, part, row.start, first and not row.replayed)  # a replay is no forward pass
            captures.append(capture)
    if captures:
        share = (time.perf_counter() - began) / len(captures)
        cpu_share = (time.thread_time() - began_cpu) / len(captures)
        for capture in captures:
            capture._took(share, cpu_share)
