"""Linear layers for a decode step of a few rows on the CPU, the faster of two equal products.

A decode step multiplies each weight ``W [out, in]`` by a few rows ``x [rows, in]``.
``F.linear`` computes ``x @ W.T``; on the CPU, oneMKL runs that for 2 to 8 rows far
slower than ``(W @ x.T).T``, the same product as a matrix times a few columns (SmolLM2's
output layer, 2 cores: 25 ms against 3.3 ms for 2 rows; one row takes a matrix-vector
path of 10 ms, and 3.3 ms as two equal columns). A second row of the batch then costs
1.6x one, where the weights are read once for all rows.

Which is faster depends on the CPU, the library and the shape, so nothing is assumed:
``tune`` times both for each weight shape and row count when the model loads (a
fraction of a second), and a layer takes the column form only where it won by
``MARGIN``. What was chosen is kept per machine (CPU, torch, threads) in a file of the
model cache, so later loads on the machine skip the timing and agree with the first.
The two forms add the same products in another order: results agree to float32 rounding,
as the batch's own shapes already make them (one row and two rows never ran the same kernel).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

#: The column form must be this much faster (its time under this fraction of the other's) to be taken.
MARGIN = 0.8
#: Timed runs of each form per shape and row count (their median is compared), after one warm-up.
RUNS = 3


class SmallBatchLinear(torch.nn.Linear):
    """An ``nn.Linear`` that computes ``rows`` in ``columns`` as ``(W @ x.T).T`` (the class a tuned layer
    is given: it stays an ``nn.Linear`` for everything that looks, peft's adapters included)."""

    columns: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if rows not in self.columns or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        return columns_product(self.weight, self.bias, x, rows)


def columns_product(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor, rows: int) -> torch.Tensor:
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:  # a matrix-vector product is the slow path: two equal columns instead
        flat = torch.cat([flat, flat])
    out = torch.mm(weight, flat.T).T[:rows]
    if bias is not None:
        out = out + bias
    return out.contiguous().reshape(*x.shape[:-1], weight.shape[0])


def _median_s(fn: Callable[[], object]) -> float:
    fn()
    times = []
    for _ in range(RUNS):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def faster_as_columns(weight: torch.Tensor, max_rows: int) -> frozenset[int]:
    """The row counts (1 to ``max_rows``) for which ``weight``'s product runs faster as columns."""
    won = set()
    with torch.inference_mode():
        for rows in range(1, max_rows + 1):
            x = torch.randn(rows, weight.shape[1], dtype=weight.dtype)
            plain = _median_s(functools.partial(F.linear, x, weight))
            columns = _median_s(functools.partial(columns_product, weight, None, x, rows))
            if columns < MARGIN * plain:
                won.add(rows)
    return frozenset(won)


def tune(model: torch.nn.Module, max_rows: int, kept: Path | None = None) -> dict[tuple[int, ...], frozenset[int]]:
    """Give every float32 CPU ``nn.Linear`` of ``model`` the column form for the row counts it wins;
    returns what was chosen per weight shape ``(out, in)``. ``kept``: a JSON file of earlier choices on
    this machine, read first and written with what had to be timed."""
    layers = [m for m in model.modules() if _tunable(m)]
    shapes = {tuple(layer.weight.shape) for layer in layers}
    machine = f"{machine_key()} rows {max_rows}"
    earlier = _read(kept)
    known = earlier.get(machine, {})
    chosen = {shape: frozenset(known[_name(shape)]) for shape in shapes if _name(shape) in known}
    timed = shapes - chosen.keys()
    for shape in timed:
        weight = next(layer.weight for layer in layers if tuple(layer.weight.shape) == shape)
        chosen[shape] = faster_as_columns(weight.detach(), max_rows)
    if kept is not None and timed:
        earlier[machine] = {**known, **{_name(shape): sorted(chosen[shape]) for shape in timed}}
        _write(kept, earlier)
    for layer in layers:
        columns = chosen[tuple(layer.weight.shape)]
        if columns:
            layer.__class__ = SmallBatchLinear
            layer.columns = columns
    return chosen


def machine_key() -> str:
    """What the timings depend on besides the shape: the CPU, torch (and its BLAS) and its threads."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}; torch {torch.__version__}; {torch.get_num_threads()} threads"


def _name(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


def _read(path: Path | None) -> dict[str, dict[str, list[int]]]:
    """The earlier choices by machine, those in the form ``tune`` writes (others are timed again)."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or torn by a crash
    if not isinstance(data, dict):
        return {}
    return {machine: known for machine, known in data.items() if _well_formed(known)}


def _well_formed(known: object) -> bool:
    return isinstance(known, dict) and all(
        isinstance(rows, list) and all(isinstance(r, int) for r in rows) for rows in known.values()
    )


def _write(path: Path, data: dict[str, dict[str, list[int]]]) -> None:
    """Whole or not at all: servers that start together each replace the file, none sees half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=1, sort_keys=True)
    os.replace(temporary, path)


def _tunable(module: torch.nn.Module) -> bool:
    return (
        type(module) is torch.nn.Linear
        and module.weight.device.type == "cpu"
        and module.weight.dtype == torch.float32
        and module.weight.dim() == 2
    )


def describe(chosen: dict[tuple[int, ...], frozenset[int]]) -> Iterable[str]:
    """One line per weight shape: which row counts run as columns."""
    for (out, inp), rows in sorted(chosen.items()):
        yield f"{out}x{inp}: rows {sorted(rows) or 'none'} as columns"
