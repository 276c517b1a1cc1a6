"""A test-only plugin: holds a generation request on the engine thread until a file exists.

A chat request with ``"user": "hold"`` waits in ``before_forward`` (on the engine
thread, so every later request queues behind it) until ``TEST_GATE_FILE`` exists,
after writing ``TEST_GATE_FILE + ".held"`` to say it is holding. Tests use it to
put requests in the queue in a known order. Loaded through a generated
``.dist-info`` on ``PYTHONPATH`` (see ``conftest.gate_env``), never installed.
"""

from __future__ import annotations

import time
from pathlib import Path

from millm_host.hookspecs import hookimpl
from millm_host.settings import Setting


@hookimpl
def register_settings(register) -> None:
    register(Setting("TEST_GATE_FILE", str, None, "Test only: a held request waits until this file exists"))


@hookimpl
def before_forward(ctx) -> None:
    gate = ctx.settings["TEST_GATE_FILE"]
    if not gate or ctx.body.get("user") != "hold":
        return
    Path(gate + ".held").touch()
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
