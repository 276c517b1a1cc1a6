"""Test-only: make a (tiny, random) model write a scripted reply.

Tests of reply parsing need a model that writes a given text; a random model
will not. With ``SCRIPTED_OUTPUT_ENABLED`` true, a request carrying
``X-Test-Scripted-Output: <base64 of UTF-8 text>`` gets a logits processor that
allows only the next token of that text, then only EOS. It is built on the
public hooks alone (``before_forward`` returning a ``LogitsProcessorFactory``).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from millm_host.api import LogitsProcessorFactory, Setting, hookimpl

__version__ = "0.1.0"  # reported by /api/health when loaded through MILLM_PLUGIN_MODULES

HEADER = "x-test-scripted-output"


@hookimpl
def register_settings(register) -> None:
    register(Setting("SCRIPTED_OUTPUT_ENABLED", bool, False, "Test only: honour X-Test-Scripted-Output"))


def encode(text: str) -> str:
    """The header value that scripts ``text``."""
    return base64.b64encode(text.encode("utf-8")).decode("ascii")


class Script:
    """Allows exactly one token at each step: the script's next one, then EOS."""

    def __init__(self, ids: list[int], eos: int) -> None:
        self.ids, self.eos = ids, eos

    def __call__(self, generated: Sequence[int], logits: Any) -> Any:
        step = len(generated)
        target = self.ids[step] if step < len(self.ids) else self.eos
        forced = logits.clone().fill_(float("-inf"))
        forced[target] = 0.0
        return forced


@hookimpl(trylast=True)
def before_forward(ctx):
    """Force the scripted reply; applied after every other processor, so the script has the last word."""
    raw = ctx.headers.get(HEADER)
    if raw is None or not ctx.settings["SCRIPTED_OUTPUT_ENABLED"]:
        return None
    engine = ctx.engine
    ids = engine.tokenize(base64.b64decode(raw).decode("utf-8"), add_special_tokens=False)
    eos = min(engine.info.eos_token_ids)
    return [LogitsProcessorFactory(make=lambda index: Script(ids, eos), owner="scripted_output")]
