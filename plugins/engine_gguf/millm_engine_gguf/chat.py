"""Rendering a GGUF file's own chat template, as llama-cpp-python's chat completion does.

llama-cpp-python renders ``tokenizer.chat_template`` with its
``Jinja2ChatFormatter`` (sandboxed Jinja, HF-compatible ``tojson``, the
``bos_token``/``eos_token`` texts, ``strftime_now``); the same class renders it
here, so a chat through millm is the prompt ``create_chat_completion`` builds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from millm_host.api import InvalidParameter


class ChatTemplate:
    """A model's chat template, compiled once for each ``add_generation_prompt``."""

    def __init__(self, template: str, bos_token: str, eos_token: str) -> None:
        self._formatters = {
            flag: Jinja2ChatFormatter(
                template=template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=flag
            )
            for flag in (True, False)
        }

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        """The prompt text; a template that refuses the messages is a 400 naming ``messages``."""
        # Templates concatenate content as a string; a tool-call turn has none.
        rows = [{**m, "content": m.get("content") or ""} for m in messages]
        try:
            return self._formatters[add_generation_prompt](messages=rows).prompt
        except (jinja2.TemplateError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise InvalidParameter(
                f"the model's chat template cannot render these messages: {exc}", param="messages"
            ) from None
