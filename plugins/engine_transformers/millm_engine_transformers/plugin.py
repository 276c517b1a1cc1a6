"""Hook implementations of the transformers engine plugin."""

from __future__ import annotations

from millm_host.hookspecs import hookimpl

from .spec import ENGINE_NAME, SPEC


@hookimpl
def register_engines(register) -> None:
    register(SPEC)


@hookimpl
def register_request_fields(register) -> None:
    engines = [ENGINE_NAME]
    register("chat.completions", ("seed", "n", "chat_template_kwargs"), engines=engines)
    register("completions", ("seed", "n"), engines=engines)
