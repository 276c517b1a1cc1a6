"""Names: model names from file names, and the check every name shown to operators passes.

``SmolLM2-135M-Instruct.Q4_1.gguf`` → ``SmolLM2-135M-Instruct``, ``Q4_1``.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from .errors import InvalidParameter

_QUANT = re.compile(
    r"^(?P<repo>.+?)[.\-_](?P<quant>(?:I?Q\d(?:_[0-9A-Z]+)*)|F16|F32|BF16|FP16|FP32)$",
    re.IGNORECASE,
)


def split_gguf_name(path: str | Path) -> tuple[str, str | None]:
    """(repository name, quantization tag or None) of a .gguf file."""
    stem = Path(path).name
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    match = _QUANT.match(stem)
    if not match:
        return stem, None
    return match.group("repo"), match.group("quant").upper()


#: Characters a name shown to operators may not hold: controls (C0, DEL, C1), format characters
#: (bidi overrides and isolates, zero-width spaces and joiners, the BOM), lone surrogates, and
#: line or paragraph separators. Each can make a name look like another one or break a line of a log.
_HIDDEN_CATEGORIES = {
    "Cc": "a control",
    "Cf": "an invisible formatting (bidi or zero-width)",
    "Cs": "a lone surrogate",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


def check_display_name(value: str, param: str) -> str:
    """``value`` unchanged, or ``400 invalid_parameter`` naming ``param`` if it holds a hidden character.

    For every name an operator reads in a list, a log or a header: profile, probe and
    behaviour names, SAE ids. Plugins call it on the names they accept.
    """
    for position, char in enumerate(value):
        kind = _HIDDEN_CATEGORIES.get(unicodedata.category(char))
        if kind is not None:
            raise InvalidParameter(
                f"{param} holds {kind} character (U+{ord(char):04X} at position {position}); "
                "names shown to operators may not",
                param=param,
            )
    return value
