"""Test-only plugin: fail a request at a chosen point of the hook chain.

``FAULT_INJECTION`` (off by default): ``before_forward`` raises there;
``token:N`` raises from a logits processor when the N-th token is chosen (a
failure in the middle of a stream); ``oom:N`` raises the typed out-of-memory
error there. Only requests whose last user message contains ``FAULT`` fail, so
one server can serve both kinds.
"""

from __future__ import annotations

from millm_host.engine import LogitsProcessorFactory
from millm_host.errors import InsufficientMemory, MillmError
from millm_host.hookspecs import hookimpl
from millm_host.settings import Setting


@hookimpl
def register_settings(register) -> None:
    register(Setting("FAULT_INJECTION", str, "", "Test only: where to fail requests that mention FAULT"))


def _targeted(ctx) -> bool:
    texts = [m.get("content") or "" for conv in ctx.conversations for m in conv]
    prompts = [p for p in getattr(ctx.params, "prompts", []) if isinstance(p, str)]
    return any("FAULT" in t for t in texts + prompts)


@hookimpl
def before_forward(ctx):
    fault = ctx.settings["FAULT_INJECTION"]
    if not fault or not _targeted(ctx):
        return None
    if fault == "before_forward":
        raise MillmError("injected failure before the forward pass", code="injected_fault", status=500,
                         type="server_error")
    kind, _, count = fault.partition(":")
    limit = int(count)

    def make(sequence_index):
        def process(generated, logits):
            if len(generated) >= limit:
                if kind == "oom":
                    raise InsufficientMemory("cpu ran out of memory (injected)", type="invalid_request_error")
                raise MillmError("injected failure while generating", code="injected_fault", status=500,
                                 type="server_error")
            return logits
        return process

    return [LogitsProcessorFactory(make, owner="fault_injection")]
