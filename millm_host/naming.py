"""Model names from file names: ``SmolLM2-135M-Instruct.Q4_1.gguf`` → ``SmolLM2-135M-Instruct``, ``Q4_1``."""

from __future__ import annotations

import re
from pathlib import Path

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
