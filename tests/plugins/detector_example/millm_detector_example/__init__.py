"""An example third-party detector: flags replies that shout (many capital letters).

It uses nothing but millm's public hooks: a setting, a header and a body field on
every chat completion (on the finish chunk when streaming). Enabled only when
``DETECTOR_EXAMPLE_ENABLED`` is true, so it does not change other tests' responses.

With ``DETECTOR_EXAMPLE_LAYER`` set (an engine with layer hooks), it also reads the
residual after that layer and reports each position's norm (``residual_norms``), as a
batched read hook (``LayerHook.batched``): under continuous batching one call per pass
serves every request in the batch, with one norm over the whole batch and one copy of
it to the host, and each request keeps only its own rows (``HookRow``).
"""

from __future__ import annotations

import uuid

from millm_host.api import ORDER_READ_POST_STEERING, HookRow, LayerHook, ResponseExtra, Setting, hookimpl

__version__ = "0.1.0"  # reported by /api/health when loaded through MILLM_PLUGIN_MODULES

STATE_KEY = "detector_example"
NORMS_KEY = "detector_example_norms"


@hookimpl
def register_settings(register) -> None:
    register(Setting("DETECTOR_EXAMPLE_ENABLED", bool, False, "Score every chat reply for shouting"))
    register(
        Setting(
            "DETECTOR_EXAMPLE_LAYER", int, -1, "Also report each position's residual norm after this layer (-1: off)"
        )
    )


def norm_rows(hidden, rows: list[HookRow]) -> None:
    """Each listed request's residual norms of this pass (``LayerHook.batched``): the batch's in one go."""
    norms = hidden.float().norm(dim=-1).tolist()  # [batch][seq]: the pass's one device-to-host copy
    for row in rows:
        seen = row.hook.state
        for offset, value in enumerate(norms[row.index][row.skip :]):
            seen[row.start + offset] = value


@hookimpl
def before_forward(ctx):
    settings = ctx.settings
    layer = settings["DETECTOR_EXAMPLE_LAYER"]
    if not settings["DETECTOR_EXAMPLE_ENABLED"] or layer < 0 or not ctx.is_chat:
        return None
    if ctx.engine is None or not ctx.engine.hook_points or ctx.n > 1 or len(ctx.prompts) > 1:
        return None  # one sequence read per request: its rows are its positions
    seen: dict[int, float] = {}
    ctx.state[NORMS_KEY] = seen

    def per_row(hidden, start):  # for an engine that calls hooks per row: the same, on a batch of one
        norm_rows(hidden, [HookRow(0, start, 0, hook)])

    hook = LayerHook(
        layer, "resid_post", per_row, ORDER_READ_POST_STEERING, "detector_example", batched=norm_rows, state=seen
    )
    return [hook]


def _score(text: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return round(sum(c.isupper() for c in letters) / len(letters), 4) if letters else 0.0


@hookimpl
def after_generate(ctx) -> None:
    if ctx.is_chat and ctx.settings["DETECTOR_EXAMPLE_ENABLED"] and not ctx.interrupted:
        ctx.state[STATE_KEY] = [_score(out.text) for out in ctx.outputs]


@hookimpl
def render_headers(ctx):
    scores = ctx.state.get(STATE_KEY)
    if scores is None:
        return None
    return {"X-Detector-Shouting": ",".join(f"{s:.4f}" for s in scores)}


@hookimpl
def response_extras(ctx):
    scores = ctx.state.get(STATE_KEY)
    if scores is None:
        return None
    body = {"shouting": scores}
    seen = ctx.state.get(NORMS_KEY)
    if seen is not None:
        body["residual_norms"] = [seen[position] for position in sorted(seen)]
    return [ResponseExtra({"detector_example": body}, order=400)]


@hookimpl
def monitor_results(ctx, monitored):
    """Beside armed probes: a ``shouting`` result per armed behaviour and window (hook ``monitor_results``).

    On ``POST /api/probes/score`` the hook has no ``ctx`` (``monitored.stateless``): settings come from the host."""
    settings = ctx.settings if ctx is not None else monitored.host.settings
    if not settings["DETECTOR_EXAMPLE_ENABLED"]:
        return None
    results = []
    for behaviour, windows in monitored.behaviours.items():
        for window in windows:
            text = monitored.window(window)
            score = _score(text.text) if text.text is not None else None
            results.append(
                {
                    "schema": "mi.probe.result/v1",
                    "kind": "detector_example",
                    "result_id": str(uuid.uuid4()),
                    "request_id": monitored.request_id,
                    "trace_id": monitored.trace_id,
                    "span_id": monitored.span_id,
                    "probe_id": None,
                    "name": "shouting",
                    "behaviour": behaviour,
                    "window": window,
                    "outcome": "completed" if score is not None else text.outcome,
                    "reason": text.reason,
                    "status": text.status if score is None else "final",
                    "fires": score > 0.5 if score is not None else None,
                    "count": 0,
                    "score": score,
                }
            )
    return results
