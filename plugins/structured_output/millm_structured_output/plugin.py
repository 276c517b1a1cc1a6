"""Hook implementations: ``response_format`` and function calling on the transformers engine.

Both shape a reply: ``response_format`` constrains the tokens (a logits
processor per sequence, the finished document validated: a failure is a 500, or on a stream, where the
tokens are already sent, a verdict in the last chunk), tools are rendered by
the model's own template, the reply constrained by one grammar in the family's
call syntax (``tools/grammar.py``: every call held to its function's
``parameters``) and read back into ``tool_calls`` (an output filter per
sequence). A template that shows tools in none of the formats read here gets
the generic format (``tools/generic.py``): tools described in a system message,
the reply constrained to JSON. ``strict`` functions are held to the schema
subset and their calls checked (``tools/strict.py``). A request that uses
neither gets nothing installed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from millm_host.api import (
    LOGITS_PROCESSORS,
    FieldNotHonoured,
    InvalidParameter,
    LogitsProcessorFactory,
    OutputFilterFactory,
    ResponseExtra,
    hookimpl,
)

from .constraint import ConstraintCompiler, JsonConstraint
from .errors import ConstrainedOutputInvalid, ResponseFormatUnsupported
from .headers import HEADER, constrained_header
from .response_format import PARAM, ResponseFormat, parse_response_format
from .schemas import StructuredOutputFields
from .tools.filter import ToolCallFilter
from .tools.formats import CallFormat
from .tools.generic import describe_tools, reply_format, show_tools, write_generic_history
from .tools.generic_filter import GenericToolFilter
from .tools.grammar import tools_format
from .tools.history import add_tool_history, write_calls_into_content
from .tools.request import ToolRequest, parse_tool_request
from .tools.strict import call_problem, check_strict
from .tools.template import template_traits
from .validation import document_problem

log = logging.getLogger("millm.structured_output")

NAME = "structured_output"
#: The stream's verdict on each constrained choice (``response_extras``).
VALIDATION_FIELD = "millm_validation"

_RESPONSE_FORMAT_FIELDS = (
    "response_format",
    "response_format.type",
    "response_format.json_schema",
    "response_format.json_schema.name",
    "response_format.json_schema.description",
    "response_format.json_schema.schema",
    "response_format.json_schema.strict",
)
_TOOL_FIELDS = (
    "tools",
    "tools[].type",
    "tools[].function",
    "tools[].function.name",
    "tools[].function.description",
    "tools[].function.parameters",
    "tools[].function.strict",  # every call is held to its parameters by a grammar; strict: the subset, checked
    "tool_choice",
    "tool_choice.type",
    "tool_choice.function",
    "tool_choice.function.name",
    "parallel_tool_calls",
)
_HISTORY_FIELDS = (
    "tool_calls",
    "tool_calls[].id",
    "tool_calls[].type",
    "tool_calls[].function",
    "tool_calls[].function.name",
    "tool_calls[].function.arguments",
    "tool_call_id",
)

#: Compiled grammars and matchers, shared by every request of this process (bounded).
COMPILER = ConstraintCompiler()


@dataclass
class Plan:
    """What this plugin does for one request (``ctx.state["structured_output"]``)."""

    response_format: ResponseFormat | None = None
    tools: ToolRequest | None = None
    history: list[str] = field(default_factory=list)
    call_format: CallFormat | None = None
    #: Per choice, set after a streamed constrained generation: {"index", "status", "message"?}.
    verdicts: list[dict[str, Any]] | None = None
    #: The generic format's reply constraint (set when the tools are shown that way).
    generic: ResponseFormat | None = None
    #: The one grammar for the reply (``tools/grammar.py``): tools shown in a family's format, or
    #: with a response_format (calls or the document).
    grammar: ResponseFormat | None = None


@hookimpl
def register_request_fields(register) -> None:
    """response_format, tools and tool-call history: chat completions, on engines that apply logits
    processors only."""
    history = (*(f"messages[].{f}" for f in _HISTORY_FIELDS), *(f"extra_messages[][].{f}" for f in _HISTORY_FIELDS))
    register("chat.completions", (*_RESPONSE_FORMAT_FIELDS, *_TOOL_FIELDS, *history), requires=LOGITS_PROCESSORS)


@hookimpl
def register_request_schemas(register) -> None:
    """response_format and tools, in the chat completion request schema of ``/openapi.json``."""
    register("chat.completions", StructuredOutputFields)


@hookimpl
def validate_request(ctx) -> None:
    """Read the request, refuse what cannot be honoured, carry tool history into the render."""
    if not ctx.is_chat or LOGITS_PROCESSORS not in ctx.engine_capabilities:
        return
    fmt = parse_response_format(ctx.body.get("response_format"))
    tools = parse_tool_request(ctx.body)
    if fmt is not None:
        _refuse_combinations(ctx, fmt, tools)
        COMPILER.grammar(fmt)  # a schema the library cannot compile is refused before any load
    if tools is not None and tools.tools and ctx.scoring:
        raise FieldNotHonoured("tools cannot be used on a scoring request", param="tools")
    if tools is not None:
        check_strict(tools)
    history = add_tool_history(ctx.messages, ctx.conversations)
    if tools is not None and tools.shown:
        ctx.chat_tools = tools.tools
    if fmt is not None or tools is not None or history:
        ctx.state[NAME] = Plan(response_format=fmt, tools=tools, history=history)


def _refuse_combinations(ctx, fmt: ResponseFormat, tools: ToolRequest | None) -> None:
    # tools are not refused: the reply is a call or the document, under one grammar (``tools/grammar.py``)
    refused = (
        (bool(ctx.params.stop_list), "cannot be combined with stop (a stop string could cut the document)"),
        (ctx.scoring, "cannot be used on a scoring request"),
    )
    for applies, why in refused:
        if applies:
            raise ResponseFormatUnsupported(f"a {fmt.kind} response_format {why}", param=PARAM)


@hookimpl
def before_tokenize(ctx) -> None:
    """Build the constraints for the resident model; check its template, write history."""
    plan: Plan | None = ctx.state.get(NAME)
    if plan is None:
        return
    if plan.response_format is not None:
        COMPILER.prepare(ctx.engine, plan.response_format)  # a failure refuses the request before it queues
    info = ctx.engine.info
    traits = template_traits(info.chat_template) if info.chat_template else None
    native_format = traits.call_format if traits is not None and traits.takes_tools else None
    tools = plan.tools
    if tools is not None and tools.shown:
        if native_format is not None:
            plan.call_format = native_format
        else:
            plan.generic = _prepare_generic(ctx.engine, tools)
    if plan.history:
        _write_history(ctx, plan, traits)
    if tools is not None and tools.shown and (plan.call_format is not None or plan.response_format is not None):
        plan.grammar = _prepare_grammar(ctx.engine, tools, plan.call_format, plan.response_format)
    if plan.generic is not None:
        assert tools is not None  # generic is set above, for tools shown
        ctx.chat_tools = None  # the system message shows them, in the shapes the constraint allows
        text = describe_tools(tools, document=plan.grammar is not None)
        for conversation in ctx.conversations:
            show_tools(conversation, text, info.chat_template)


def _prepare_generic(engine, tools: ToolRequest) -> ResponseFormat:
    """The generic reply constraint for ``tools``, compiled for ``engine`` (a failure refuses the request)."""
    fmt = reply_format(tools)
    try:
        COMPILER.prepare(engine, fmt)
    except ResponseFormatUnsupported as exc:
        raise InvalidParameter(f"the tools' parameters cannot be enforced: {exc.message}", param="tools") from None
    return fmt


def _prepare_grammar(
    engine, tools: ToolRequest, call_format: CallFormat | None, fmt: ResponseFormat | None
) -> ResponseFormat:
    """The one grammar for the reply, compiled for ``engine`` (a failure refuses the request)."""
    grammar = tools_format(tools, call_format, fmt, getattr(engine, "tokenizer", None))
    try:
        COMPILER.prepare(engine, grammar)
    except ResponseFormatUnsupported as exc:
        what = "combined with this response_format" if fmt is not None else "enforced"
        raise InvalidParameter(f"the tools cannot be {what}: {exc.message}", param="tools") from None
    return grammar


def _write_history(ctx, plan: Plan, traits) -> None:
    """Tool-call history: the template renders it, or it is written into content (the family's or the generic syntax)."""
    if plan.generic is None and traits is not None and traits.renders_tool_calls:
        return  # the template renders tool_calls and tool results itself
    if plan.generic is None and traits is not None and traits.call_format is not None:
        write_calls_into_content(ctx.conversations, traits.call_format, ctx.messages)
        return
    write_generic_history(ctx.conversations, plan.tools.parallel if plan.tools is not None else True)


@hookimpl
def before_forward(ctx) -> list[Any] | None:
    """A JSON constraint per sequence for response_format; a tool-call filter per sequence for tools."""
    plan: Plan | None = ctx.state.get(NAME)
    if plan is None:
        return None
    installed: list[Any] = []
    engine = ctx.engine
    if plan.grammar is not None:
        installed.append(_constraint(engine, plan.grammar))
    elif plan.response_format is not None:
        installed.append(_constraint(engine, plan.response_format))
    if plan.generic is not None and plan.tools is not None:
        names, parallel = plan.tools.names, not plan.tools.one_call
        document = plan.grammar is not None  # with a response_format: calls or the document
        if not document:
            installed.append(_constraint(engine, plan.generic))
        installed.append(
            OutputFilterFactory(make=lambda index: GenericToolFilter(names, parallel, document=document), owner=NAME)
        )
    if plan.call_format is not None:  # set exactly when the tools are shown natively (under plan.grammar)
        tools, call_format = plan.tools, plan.call_format
        assert tools is not None
        installed.append(
            OutputFilterFactory(
                make=lambda index: ToolCallFilter(call_format, tools.names, tools.parallel, live=True), owner=NAME
            )
        )
    return installed or None


def _constraint(engine, fmt: ResponseFormat) -> LogitsProcessorFactory:
    """A fresh llguidance matcher per sequence, copied from the one compiled for ``engine``."""
    ready = COMPILER.prepare(engine, fmt)
    vocab_size, eos_ids = engine.info.vocab_size, sorted(engine.info.eos_token_ids)
    return LogitsProcessorFactory(make=lambda index: JsonConstraint(ready.deep_copy(), vocab_size, eos_ids), owner=NAME)


@hookimpl
def after_generate(ctx) -> None:
    """Validate each complete constrained document, and each call to a ``strict`` function.

    Not streamed: a failure is ``500 constrained_output_invalid``. Streamed: the
    tokens are already out, so each choice's verdict goes in the last chunk
    (``millm_validation``, through ``response_extras``).
    """
    plan: Plan | None = ctx.state.get(NAME)
    if plan is None or ctx.error is not None or ctx.interrupted:
        return
    verdicts: list[dict[str, Any]] = []
    for out in ctx.outputs:
        verdict = _verdict(plan, out)
        if verdict is None:
            continue
        if verdict["status"] == "invalid":
            log.error("constrained output invalid (choice %d): %s", out.index, verdict["message"])
            if not ctx.streaming:
                raise ConstrainedOutputInvalid(f"choice {out.index}: {verdict['message']}")
        verdicts.append(verdict)
    if ctx.streaming and (plan.response_format is not None or verdicts):
        plan.verdicts = verdicts


def _verdict(plan: Plan, out) -> dict[str, Any] | None:
    """One choice's verdict: its strict calls break their schema, or its document's (None: nothing to say)."""
    calls = out.message_extras.get("tool_calls")
    if calls and plan.tools is not None and plan.tools.strict:
        problem = call_problem(calls, plan.tools)
        if problem is not None:
            return {"index": out.index, "status": "invalid", "message": problem}
    if plan.response_format is None or out.finish_reason == "tool_calls":
        return None  # tools with a response_format: this reply is calls, not the document
    if out.finish_reason != "stop":  # "length": max_tokens cut the document, which is reported, not validated
        return {"index": out.index, "status": "incomplete"}
    problem = document_problem(out.text, plan.response_format)
    if problem is None:
        return {"index": out.index, "status": "valid"}
    return {"index": out.index, "status": "invalid", "message": problem}


@hookimpl
def response_extras(ctx) -> list[ResponseExtra] | None:
    """A stream's verdict on each constrained choice: ``valid``, ``invalid`` (with why) or ``incomplete``."""
    plan: Plan | None = ctx.state.get(NAME)
    if plan is None or plan.verdicts is None:
        return None
    return [ResponseExtra({VALIDATION_FIELD: plan.verdicts})]


@hookimpl
def render_headers(ctx) -> dict[str, str] | None:
    """``X-miLLM-Constrained`` on a constrained reply."""
    plan: Plan | None = ctx.state.get(NAME)
    if plan is None or plan.response_format is None:
        return None
    return {HEADER: constrained_header(plan.response_format)}


@hookimpl
def model_loaded(engine) -> None:
    """Build llguidance's view of the model's tokenizer now, while it loads, not on its first
    constrained request (tools or response_format): that build holds the GIL 150-200 ms, and the
    event loop waited behind it however off the loop it ran."""
    if getattr(engine, "tokenizer", None) is None:
        return
    try:
        COMPILER.warm(engine)
    except ResponseFormatUnsupported:
        pass  # the request that asks is refused, saying why


@hookimpl
def model_unloading(engine) -> None:
    """Drop the tokenizer view and matchers built for the model going away."""
    COMPILER.forget(engine)
