"""Gathering the residual rows probes read, on the device, during the forward passes.

One read hook per residual point (``ORDER_READ_PRE_STEERING``: probes see the
residual before any steering write at that point). Each forward pass copies its
rows into a buffer sized once for the whole request, so nothing leaves the
device until scoring, which happens once, after the last pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from millm_host.api import ORDER_READ_PRE_STEERING, LayerHook

from .scoring import Point

OWNER = "probes"


class Capture:
    """Residual rows per point for one sequence: ``rows[point][:positions]``."""

    def __init__(self, points: Iterable[Point], capacity: int) -> None:
        self.points = list(points)
        self.capacity = max(1, capacity)
        self.buffers: dict[Point, Any] = {}
        self.filled: dict[Point, int] = {}
        self.passes = 0
        self.seconds = 0.0  # time spent inside the callbacks

    def hooks(self) -> list[LayerHook]:
        return [
            LayerHook(layer, point, self._callback((layer, point), first=i == 0), ORDER_READ_PRE_STEERING, OWNER)
            for i, (layer, point) in enumerate(self.points)
        ]

    def _callback(self, point: Point, first: bool):
        def read(hidden: Any, start: int) -> None:
            began = time.perf_counter()
            rows = hidden[0]
            end = start + rows.shape[0]
            buffer = self.buffers.get(point)
            if buffer is None or end > buffer.shape[0]:
                buffer = self._grow(point, buffer, rows, end)
            buffer[start:end].copy_(rows)
            self.filled[point] = max(self.filled.get(point, 0), end)
            if first:
                self.passes += 1
            self.seconds += time.perf_counter() - began
            return None

        return read

    def _grow(self, point: Point, old: Any, rows: Any, end: int) -> Any:
        import torch

        size = max(self.capacity, end)
        buffer = torch.empty((size, rows.shape[-1]), dtype=rows.dtype, device=rows.device)
        if old is not None:
            buffer[: old.shape[0]].copy_(old)
        self.buffers[point] = buffer
        return buffer

    @property
    def positions(self) -> int:
        """Positions whose residual every point holds (a pass cut off half-way counts at none)."""
        if len(self.filled) < len(self.points):
            return 0
        return min(self.filled.values())

    def rows(self) -> dict[Point, Any]:
        positions = self.positions
        return {point: buffer[:positions] for point, buffer in self.buffers.items()}
