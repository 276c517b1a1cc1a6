"""Timing the resident model's own step and what probes add to it (engine thread).

The model's step: greedy generation, time per generated token after the
first; a forward pass over a prompt, scaled to 1,000 tokens. The probes: the
read hook's per-pass copy for one hooked point (one row per generated token,
a thousand for a prompt), and the bank's product and the host-side
aggregation for mean, max and attention probes, one and nine at a time, so a
probe's own part is told apart from the per-point part. Each figure is the
median of several runs.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from millm_host.api import SamplingParams

from .capacity import SPARSE_FACTOR, identity_of
from .capture import Capture
from .results import now_iso
from .scoring import Bank, CompiledProbe, aggregate

DECODE_TOKENS = 32
PROMPT_TOKENS = 1000
REPEATS = 5
MANY = 9  # probes of one kind timed together against one


def _sync(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def _median(fn: Callable[[], float], repeats: int = REPEATS) -> float:
    fn()  # warm-up
    return statistics.median(fn() for _ in range(repeats))


def _prompt(engine: Any, length: int) -> list[int]:
    ids = engine.tokenize("The quick brown fox jumps over the lazy dog. " * (length // 8 + 2), add_special_tokens=False)
    return list(ids[:length])


def _step(engine: Any, sync: Callable[[], None]) -> dict[str, Any]:
    info = engine.info
    window = info.context_window or 4096
    prompt_len = max(8, min(PROMPT_TOKENS, window - DECODE_TOKENS - 2))
    prompt = _prompt(engine, prompt_len)
    short = prompt[:16]

    def decode() -> float:
        tokens = engine.generate(short, SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0.0))
        next(tokens)  # the prompt's pass and the first token
        sync()
        began = time.perf_counter()
        for _ in range(DECODE_TOKENS):
            next(tokens)
        sync()
        elapsed = time.perf_counter() - began
        tokens.close()
        return elapsed * 1000 / DECODE_TOKENS

    def prefill() -> float:
        sync()
        began = time.perf_counter()
        engine.forward(prompt)
        sync()
        return (time.perf_counter() - began) * 1000 * 1000 / len(prompt)

    return {
        "ms_per_token": _median(decode, 3),
        "ms_per_1k_prompt": _median(prefill, 3),
        "decode_tokens_timed": DECODE_TOKENS,
        "prompt_tokens_timed": len(prompt),
    }


def _hook_ms(engine: Any, rows: int, sync: Callable[[], None]) -> float:
    """One hooked point's read callback for one pass of ``rows`` positions."""
    import torch

    info = engine.info
    dtype = getattr(torch, (info.dtype or "float32").replace("torch.", ""), torch.float32)
    hidden = torch.randn((1, rows, info.d_model), dtype=dtype, device=info.device)
    capture = Capture([(0, "resid_post")], rows * 4)
    [hook] = capture.hooks()

    def once() -> float:
        sync()
        began = time.perf_counter()
        for i in range(4):
            hook.callback(hidden, i * rows)
        sync()
        return (time.perf_counter() - began) * 1000 / 4

    return _median(once)


def _probe(key: str, rule: str, d_model: int, device: str, rng: np.random.Generator) -> CompiledProbe:
    import torch

    weights = torch.tensor(rng.normal(size=d_model), dtype=torch.float32, device=device)
    query = torch.tensor(rng.normal(size=d_model), dtype=torch.float32, device=device) if rule == "attention" else None
    return CompiledProbe(key, (0, "resid_post"), weights, 0.0, query, None)


def _bank_ms(engine: Any, rule: str, count: int, positions: int, sync: Callable[[], None]) -> float:
    """The bank's product and the host-side aggregation of ``count`` probes of ``rule`` over ``positions``."""
    import torch

    info = engine.info
    rng = np.random.default_rng(0)
    bank = Bank([_probe(f"p{i}", rule, info.d_model, info.device, rng) for i in range(count)])
    rows = {(0, "resid_post"): torch.randn((positions, info.d_model), device=info.device)}

    def once() -> float:
        sync()
        began = time.perf_counter()
        columns = bank.columns(rows)
        for i in range(count):
            aggregate(rule, None, bank.per_token(columns, f"p{i}"), bank.logits(columns, f"p{i}"))
        return (time.perf_counter() - began) * 1000

    return _median(once)


def _units(engine: Any, sync: Callable[[], None]) -> dict[str, dict[str, float]]:
    units: dict[str, dict[str, float]] = {}
    for half, rows in (("per_token", 1), ("per_1k_prompt", PROMPT_TOKENS)):
        # Live scoring runs once per request over every position, so a generated token's share of it is
        # one position's: timed over a thousand and divided down for the per-token half.
        scale = 1.0 / PROMPT_TOKENS if half == "per_token" else 1.0
        timed = PROMPT_TOKENS
        fixed = []
        line: dict[str, float] = {}
        for rule in ("mean", "max", "attention"):
            one = _bank_ms(engine, rule, 1, timed, sync) * scale
            many = _bank_ms(engine, rule, MANY, timed, sync) * scale
            each = max((many - one) / (MANY - 1), 1e-6)
            line[rule] = each
            fixed.append(max(one - each, 0.0))
        line["layer"] = _hook_ms(engine, rows, sync) + min(fixed)
        line["sparse"] = SPARSE_FACTOR * line["mean"]
        units[half] = {k: round(v, 6) for k, v in line.items()}
    return units


def measure(engine: Any, model_id: str) -> dict[str, Any]:
    """The measurement stored with the model (engine thread; the caller checked nothing is armed)."""
    sync = _sync(engine.info.device)
    return {
        "object": "probe.capacity_measurement",
        "measurement_id": "pm_" + secrets.token_hex(6),
        "model_id": model_id,
        "model_load_id": engine.info.load_id,
        "identity": identity_of(engine.info),
        "step": _step(engine, sync),
        "units": _units(engine, sync),
        "units_note": "ms per hooked point (layer) and per probe by kind; sparse is estimated at "
        f"{SPARSE_FACTOR:g}x a dense probe",
        "measured_at": now_iso(),
    }
