"""An example third-party detector: flags replies that shout (many capital letters).

It uses nothing but millm's public hooks: a setting, a header and a body field on
every chat completion (on the finish chunk when streaming). Enabled only when
``DETECTOR_EXAMPLE_ENABLED`` is true, so it does not change other tests' responses.
"""

from __future__ import annotations

from millm_host.api import ResponseExtra, Setting, hookimpl

__version__ = "0.1.0"  # reported by /api/health when loaded through MILLM_PLUGIN_MODULES

STATE_KEY = "detector_example"


@hookimpl
def register_settings(register) -> None:
    register(Setting("DETECTOR_EXAMPLE_ENABLED", bool, False, "Score every chat reply for shouting"))


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
    return [ResponseExtra({"detector_example": {"shouting": scores}}, order=400)]
