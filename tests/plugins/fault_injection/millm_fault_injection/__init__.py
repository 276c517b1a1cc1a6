"""Test-only plugin: fail or stall a request at a chosen point of the hook chain.

``FAULT_INJECTION`` (off by default): ``before_forward`` raises there;
``token:N`` raises from a logits processor when the N-th token is chosen (a
failure in the middle of a stream); ``oom:N`` raises the typed out-of-memory
error there; ``rendering`` makes ``render_headers`` and ``response_extras``
raise (only ``response_extras`` for a request that says ``FAULT-EXTRAS``);
``stall:N:S`` blocks the engine thread for S seconds there and
ignores cancellation (a hung generation); ``slow:N:S`` blocks there for up to S
seconds but returns as soon as the request is cancelled (one very long step);
``gate:N:PATH`` blocks there until the file PATH exists or the request is
cancelled (a step that lasts exactly as long as the test wants: it creates the
file when it is done looking, and deletes it to close the gate again).
Only requests whose last user message contains ``FAULT`` are affected, so one
server can serve both kinds.
"""

from __future__ import annotations

import time
from pathlib import Path

from millm_host.api import InsufficientMemory, LogitsProcessorFactory, MillmError, Setting, hookimpl

__version__ = "0.1.0"  # reported by /api/health when loaded through MILLM_PLUGIN_MODULES

#: How often a closed gate looks for its file.
GATE_POLL_S = 0.05


@hookimpl
def register_settings(register) -> None:
    register(Setting("FAULT_INJECTION", str, "", "Test only: where to fail requests that mention FAULT"))
    register(Setting("FAULT_INJECTION_LOAD_DELAY_S", float, 0.0, "Test only: seconds added to every model load"))
    register(
        Setting(
            "FAULT_INJECTION_LOAD_DELAY_MODELS",
            str,
            "",
            "Test only: the model ids (comma-separated) whose loads are delayed; empty: every model's",
        )
    )


def _targeted(ctx) -> bool:
    return any("FAULT" in t for t in _texts(ctx))


def _texts(ctx) -> list[str]:
    texts = [m.get("content") or "" for conv in ctx.conversations for m in conv]
    return texts + [p for p in getattr(ctx.params, "prompts", []) if isinstance(p, str)]


@hookimpl
def before_forward(ctx):
    fault = ctx.settings["FAULT_INJECTION"]
    if not fault or fault == "rendering" or not _targeted(ctx):
        return None
    if fault == "before_forward":
        raise MillmError(
            "injected failure before the forward pass", code="injected_fault", status=500, type="server_error"
        )
    kind, count, *rest = fault.split(":", 2)
    limit = int(count)
    gate = Path(rest[0]) if kind == "gate" else None
    seconds = float(rest[0]) if rest and gate is None else 0.0

    def make(sequence_index):
        def process(generated, logits):
            if len(generated) == limit and kind == "stall":
                time.sleep(seconds)
            elif len(generated) == limit and kind == "slow":
                ctx.cancel_event.wait(seconds)
            elif len(generated) == limit and gate is not None:
                while not gate.exists() and not ctx.cancel_event.wait(GATE_POLL_S):
                    pass
            elif len(generated) >= limit and kind == "oom":
                raise InsufficientMemory("cpu ran out of memory (injected)", type="invalid_request_error")
            elif len(generated) >= limit and kind == "token":
                raise MillmError(
                    "injected failure while generating", code="injected_fault", status=500, type="server_error"
                )
            return logits

        return process

    return [LogitsProcessorFactory(make, owner="fault_injection")]


def _render_fault(ctx, hook: str) -> None:
    if ctx.settings["FAULT_INJECTION"] != "rendering" or not _targeted(ctx):
        return
    if hook == "render_headers" and any("FAULT-EXTRAS" in t for t in _texts(ctx)):
        return
    raise RuntimeError(f"injected failure in {hook}")


@hookimpl
def render_headers(ctx):
    _render_fault(ctx, "render_headers")
    return None


@hookimpl
def response_extras(ctx):
    _render_fault(ctx, "response_extras")
    return None


@hookimpl
def model_loaded(host, engine) -> None:
    """``FAULT_INJECTION_LOAD_DELAY_S``: a load that takes this much longer (what a slow load looks like), of
    the models ``FAULT_INJECTION_LOAD_DELAY_MODELS`` names (every model's when it names none)."""
    delay = host.settings["FAULT_INJECTION_LOAD_DELAY_S"]
    models = [name.strip() for name in host.settings["FAULT_INJECTION_LOAD_DELAY_MODELS"].split(",") if name.strip()]
    if delay > 0 and (not models or engine.info.id in models):
        time.sleep(delay)
