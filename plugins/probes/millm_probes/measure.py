"""Timing the resident model's own step and what probes add to it (engine thread).

The model's step: greedy generation, time per generated token after the
first; a forward pass over a prompt, scaled to 1,000 tokens. The probes, as
they are really paid: a hooked point per generated token's pass by generating
with every layer hooked (the live capture) against none, interleaved; a
prompt pass's point by the callback's copy of a thousand rows plus that path's
dispatch; the bank's product and the host-side aggregation for mean, max and
attention probes, one and nine at a time, so a probe's own part is told apart
from the per-point part; and once per request, the capture's set-up and the
results built and stored. Each figure is a median of several runs.
"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import sqlalchemy as sa

from millm_host.api import SamplingParams

from . import store
from .capacity import SPARSE_FACTOR, identity_of
from .capture import Capture
from .results import Reading, Served, now_iso, result_object
from .scoring import Bank, CompiledProbe, Point, aggregate
from .session_tables import ProbeSession, ProbeSessionTurn
from .sessions import Claim, Sessions
from .trace import new_trace

DECODE_TOKENS = 32
PROMPT_TOKENS = 1000
REPEATS = 5
MANY = 9  # probes of one kind timed together against one
RECORDING_REPEATS = 9  # database writes vary more than arithmetic


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


def _decode_ms(engine: Any, prompt: list[int], sync: Callable[[], None], points: list[Point]) -> tuple[float, float]:
    """(wall, this thread's CPU) milliseconds per generated token after the first; with a capture on ``points``
    as live requests read."""
    hooks = Capture(points, len(prompt) + DECODE_TOKENS + 1).hooks() if points else []
    tokens = engine.generate(prompt, SamplingParams(max_tokens=DECODE_TOKENS + 1, temperature=0.0), hooks=hooks)
    next(tokens)  # the prompt's pass and the first token
    sync()
    began, cpu = time.perf_counter(), time.thread_time()
    for _ in range(DECODE_TOKENS):
        next(tokens)
    sync()
    elapsed, cpu_elapsed = time.perf_counter() - began, time.thread_time() - cpu
    tokens.close()
    return elapsed * 1000 / DECODE_TOKENS, cpu_elapsed * 1000 / DECODE_TOKENS


def _step(engine: Any, sync: Callable[[], None]) -> tuple[dict[str, Any], float]:
    """The model's own step, and what one hooked point adds to a generated token's pass as it is really
    paid (torch's hook dispatch, the engine's wrapper, the callback and its copy): generation with every
    layer hooked against none, interleaved, the median of the paired differences per hooked layer.

    On a CPU the difference is taken in the engine thread's CPU time: the hook path runs on that thread,
    and other processes' load (which moves wall time by far more than a hook costs) does not enter it.
    On a GPU, where the work is asynchronous, it is wall time."""
    info = engine.info
    window = info.context_window or 4096
    prompt_len = max(8, min(PROMPT_TOKENS, window - DECODE_TOKENS - 2))
    prompt = _prompt(engine, prompt_len)
    short = prompt[:16]
    points = [(layer, "resid_post") for layer in range(info.n_layers)]
    _decode_ms(engine, short, sync, points)  # warm-up, both ways
    _decode_ms(engine, short, sync, [])
    plain, hooked = [], []
    for i in range(REPEATS):
        for with_hooks in (False, True) if i % 2 == 0 else (True, False):
            (hooked if with_hooks else plain).append(_decode_ms(engine, short, sync, points if with_hooks else []))
    clock = 0 if str(info.device).startswith("cuda") else 1
    per_layer = statistics.median(h[clock] - p[clock] for h, p in zip(hooked, plain, strict=True)) / len(points)

    def prefill() -> float:
        sync()
        began = time.perf_counter()
        engine.forward(prompt)
        sync()
        return (time.perf_counter() - began) * 1000 * 1000 / len(prompt)

    step = {
        "ms_per_token": statistics.median(p[0] for p in plain),
        "ms_per_1k_prompt": _median(prefill, 3),
        "decode_tokens_timed": DECODE_TOKENS,
        "prompt_tokens_timed": len(prompt),
        "hooked_ms_per_token": statistics.median(h[0] for h in hooked),
        "hooked_layers": len(points),
        "hook_clock": "wall" if clock == 0 else "engine thread CPU",
    }
    return step, per_layer


def _hook_ms(engine: Any, rows: int, sync: Callable[[], None]) -> float:
    """One hooked point's read callback for one pass of ``rows`` positions (the callback alone)."""
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


def _sample_results(engine: Any, count: int) -> list[dict[str, Any]]:
    """``count`` result objects as a request builds them (a probe-shaped stand-in for the view)."""
    evidence = SimpleNamespace(rung=2, provisional=False)
    definition = SimpleNamespace(evidence=evidence, rung_language="measured on held-out data")
    served, trace = Served.of(engine, "serial"), new_trace({})
    results = []
    for i in range(count):
        view = SimpleNamespace(
            probe_id=f"pr_measure{i:04d}",
            name=f"capacity-measure-{i}",
            behaviour="capacity-measure",
            version="1",
            definition=definition,
            detector_digest="sha256:" + "0" * 64,
            detector_digest_source="computed",
            decision_digest="sha256:" + "1" * 64,
            decision_revision=1,
            threshold_revision=1,
        )
        reading = Reading("completed", None, "final", 1.234567, 48, 1.0, True, 3)
        block = {"armed_members": count, "total_members": count, "complete": True, "missing_probe_ids": []}
        results.append(result_object(view, "all", reading, served, trace, "chatcmpl-measure", "persisted", block))
    return results


def _turn_ms(db: Any) -> float:
    """A session's turn written as a monitored request writes it (a new session: its row and its turn).
    The rows are removed afterwards, outside the timing."""
    sessions = Sessions(db)
    claim = Claim("ses_measure" + secrets.token_hex(6), "new")
    ctx = SimpleNamespace(conversations=None, request_id="capacity-measure", endpoint="completions")
    began = time.perf_counter()
    sessions.record(ctx, claim, None, 0)  # type: ignore[arg-type]  # only these fields are read
    took = time.perf_counter() - began
    with db.engine.begin() as connection:
        connection.execute(sa.delete(ProbeSessionTurn).where(ProbeSessionTurn.session_id == claim.session_id))
        connection.execute(sa.delete(ProbeSession).where(ProbeSession.id == claim.session_id))
    return took * 1000


def _recording_ms(engine: Any, db: Any) -> tuple[float, float]:
    """(per request, per result) ms of the work a monitored request does once: setting up its capture,
    writing its session's turn, and building and storing its results (the events' transaction)."""

    def setup() -> float:
        began = time.perf_counter()
        Capture([(0, "resid_post")], 1024).hooks()
        return (time.perf_counter() - began) * 1000

    def write(count: int) -> float:
        began = time.perf_counter()
        results = _sample_results(engine, count)
        built = time.perf_counter() - began
        return (built + store.time_write(db, results)) * 1000

    one = _median(lambda: write(1), RECORDING_REPEATS)
    many = _median(lambda: write(MANY), RECORDING_REPEATS)
    per_result = max((many - one) / (MANY - 1), 0.0)
    transaction = max(one - per_result, 0.0)
    return _median(setup) + _median(lambda: _turn_ms(db), RECORDING_REPEATS) + transaction, per_result


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


def _units(engine: Any, db: Any, sync: Callable[[], None], real_layer: float) -> dict[str, dict[str, float]]:
    """Unit costs per half. ``real_layer``: a hooked point's real cost per generated token's pass."""
    callback_one = _hook_ms(engine, 1, sync)
    # The real path's part beyond the callback (hook dispatch, the wrapper) does not grow with the rows;
    # the callback's copy does, so a prompt pass pays the callback on its rows plus that part.
    dispatch = max(real_layer - callback_one, 0.0)
    request, per_result = _recording_ms(engine, db)
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
        hook = max(real_layer, callback_one) if rows == 1 else _hook_ms(engine, rows, sync) + dispatch
        line["layer"] = hook + min(fixed)
        line["sparse"] = SPARSE_FACTOR * line["mean"]
        # once per request: charged to the prompt half (each request has one prompt; capacity.cost)
        line["request"] = request if half == "per_1k_prompt" else 0.0
        line["result"] = per_result if half == "per_1k_prompt" else 0.0
        units[half] = {k: round(v, 6) for k, v in line.items()}
    return units


def measure(engine: Any, model_id: str, db: Any) -> dict[str, Any]:
    """The measurement stored with the model (engine thread; the caller checked nothing is armed)."""
    sync = _sync(engine.info.device)
    step, real_layer = _step(engine, sync)
    return {
        "object": "probe.capacity_measurement",
        "measurement_id": "pm_" + secrets.token_hex(6),
        "model_id": model_id,
        "model_load_id": engine.info.load_id,
        "identity": identity_of(engine.info),
        "step": step,
        "units": _units(engine, db, sync, real_layer),
        "units_note": "ms per hooked point (layer: the read hook as a generated token's pass really pays it, "
        "every layer hooked against none) and per probe by kind; per request (request: the capture's set-up, "
        "the session's turn and the fixed part of the events' transaction) and per result (built and stored), "
        f"charged to the prompt half; sparse is estimated at {SPARSE_FACTOR:g}x a dense probe",
        "measured_at": now_iso(),
    }
