"""A test-only plugin: holds a request on the engine thread, and reports the hooks a request saw.

- A chat request with ``"user": "hold"`` waits in ``before_forward`` (on the engine
  thread with ``MILLM_BATCHING=serial``, so every later request queues behind it) until ``TEST_GATE_FILE``
  exists, after writing ``TEST_GATE_FILE + ".held"`` to say it is holding.
- A request with ``"user": "report"`` gets an ``X-Test-Hooks`` header and a
  ``test_hooks`` body field saying which request hooks ran for it, and what
  ``ctx.scoring`` and ``ctx.finished`` were when its headers were rendered.

Loaded through a generated ``.dist-info`` on ``PYTHONPATH`` (see
``conftest.gate_env``), never installed.
"""

from __future__ import annotations

import time
from pathlib import Path

from millm_host.hookspecs import hookimpl
from millm_host.output import ResponseExtra
from millm_host.settings import Setting

KEY = "test_gate"


@hookimpl
def register_settings(register) -> None:
    register(Setting("TEST_GATE_FILE", str, None, "Test only: a held request waits until this file exists"))


def _seen(ctx, hook: str) -> None:
    if ctx.body.get("user") == "report":
        ctx.state.setdefault(KEY, []).append(hook)


@hookimpl
def validate_request(ctx) -> None:
    _seen(ctx, "validate_request")


@hookimpl
def after_tokenize(ctx) -> None:
    _seen(ctx, "after_tokenize")


@hookimpl
def before_forward(ctx) -> None:
    _seen(ctx, "before_forward")
    gate = ctx.settings["TEST_GATE_FILE"]
    if not gate or ctx.body.get("user") != "hold":
        return
    Path(gate + ".held").touch()
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)


@hookimpl
def after_generate(ctx) -> None:
    _seen(ctx, "after_generate")


@hookimpl
def render_headers(ctx):
    if ctx.body.get("user") != "report":
        return None
    hooks = ",".join(ctx.state[KEY])
    return {"X-Test-Hooks": f"{hooks};scoring={int(ctx.scoring)};finished={int(ctx.finished)}"}


@hookimpl
def response_extras(ctx):
    if ctx.body.get("user") != "report":
        return None
    return [ResponseExtra({"test_hooks": list(ctx.state[KEY])})]
