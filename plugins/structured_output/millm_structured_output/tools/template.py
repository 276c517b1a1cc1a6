"""What a chat template can do with tools, read off the template itself."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.sandbox

from .formats import HERMES, LLAMA3_JSON, PYTHONIC, CallFormat

_LFM2_MARKERS = ("<|tool_call_start|>", "<|tool_list_start|>", "<|tool_response_start|>")
_LLAMA3_MARKERS = ("ipython", "<|python_tag|>")


@dataclass(frozen=True)
class TemplateTraits:
    """``takes_tools``: the template reads ``tools``; ``renders_tool_calls``: it writes
    an assistant message's ``tool_calls``; ``call_format``: how its model writes calls."""

    takes_tools: bool
    renders_tool_calls: bool
    call_format: CallFormat | None


@functools.lru_cache(maxsize=32)
def template_traits(template: str) -> TemplateTraits:
    """The tool traits of a chat template (cached per template string)."""
    return TemplateTraits(
        takes_tools=_reads_variable(template, "tools"),
        renders_tool_calls=re.search(r"\btool_calls\b", template) is not None,
        call_format=call_format(template),
    )


def call_format(template: str) -> CallFormat | None:
    """The call format the template's family writes; None when it is none of the three."""
    if any(marker in template for marker in _LFM2_MARKERS):
        return PYTHONIC
    if HERMES.start in template:
        return HERMES
    if '"parameters"' in template and any(marker in template for marker in _LLAMA3_MARKERS):
        return LLAMA3_JSON
    return None


def _reads_variable(template: str, name: str) -> bool:
    """Whether the template reads ``name`` from its context (not just mentions the word)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=[jinja2.ext.loopcontrols])
    try:
        return name in jinja2.meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:  # a tag of transformers' own environment: read the text
        return re.search(rf"\b{re.escape(name)}\b", template) is not None
