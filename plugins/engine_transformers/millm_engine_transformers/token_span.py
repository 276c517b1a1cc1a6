"""A cheap lower bound on the tokens a HF fast tokenizer makes of a text, where its vocabulary allows one.

The host refuses a text that cannot fit the window from this bound, without tokenizing
it (``Engine.min_tokens``). A token covers at most as many characters of text as its
own string has (the longest vocabulary entry, added and special tokens included), so a
text is at least its characters over that many tokens. That holds only where:

- the model is BPE whose unknown symbols are bytes: byte-level (each character of an
  entry is one byte, and a text has at least as many bytes as characters) or with
  byte fallback. WordPiece's ``[UNK]`` stands for a whole word, a fused unknown token
  for any run of characters;
- nothing shortens the text first: no normalizer, or only ``Prepend`` and literal
  ``Replace``s by strings at least as long (Llama 2's " " → "▁"), or NFC alone
  (Qwen's and GPT-NeoX's tokenizers), which composes characters: a character that NFC
  never merges into the one before it (``nfc``) keeps a character of its own, so only
  those are counted. Other normalizers may strip characters: no bound.

A byte-level vocabulary may lack a byte's symbol; BPE then drops that byte. The
characters made only of such bytes (control characters, in SmolLM2's) are not
counted; where a continuation byte (0x80-0xBF) is missing there is no bound.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import nfc


@dataclass(frozen=True)
class TokenFloor:
    #: The most characters one token covers.
    per_token: int
    #: Characters the tokenizer may drop (a byte missing from a byte-level vocabulary).
    dropped: str = ""
    #: The text is NFC-normalized first: characters NFC may merge into the one before are not counted.
    nfc: bool = False

    @classmethod
    def of(cls, tokenizer: Any) -> TokenFloor | None:
        """The bound for ``tokenizer`` (a transformers fast tokenizer), or None where none holds."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or type(backend.model).__name__ != "BPE":
            return None
        normalizer = _state(backend.normalizer)
        composes = normalizer is not None and normalizer.get("type") == "NFC"
        if not composes and not _never_shortens(normalizer):
            return None
        vocab = tokenizer.get_vocab()
        per_token = max(map(len, vocab), default=0)
        if per_token == 0:
            return None
        if getattr(backend.model, "byte_fallback", False):
            return cls(per_token, nfc=composes) if all(f"<0x{b:02X}>" in vocab for b in range(256)) else None
        if not _has_byte_level(_state(backend.pre_tokenizer)):
            return None
        from tokenizers.pre_tokenizers import ByteLevel

        symbols = _byte_symbols(ByteLevel.alphabet())
        missing = [b for b, symbol in symbols.items() if symbol not in vocab]
        if any(0x80 <= b <= 0xBF for b in missing):
            return None
        return cls(per_token, "".join(chr(b) for b in missing if b < 0x80), nfc=composes)

    def tokens(self, texts: Sequence[str]) -> int:
        """At least this many tokens in any text holding all of ``texts``."""
        return -(-sum(map(self._kept, texts)) // self.per_token)

    def _kept(self, text: str) -> int:
        """Characters of ``text`` the tokenizer keeps, each a byte at least (dropped ones are ASCII, merged ones not)."""
        kept = len(text) - sum(text.count(c) for c in self.dropped)
        return kept - nfc.mergeable(text) if self.nfc else kept


def _byte_symbols(alphabet: Sequence[str]) -> dict[int, str]:
    """Byte → its symbol in a byte-level vocabulary (GPT-2's mapping, as ``tokenizers`` builds it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in printable:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    assert set(symbols.values()) == set(alphabet)
    return symbols


def _state(component: Any) -> dict[str, Any] | None:
    return None if component is None else json.loads(component.__getstate__())


def _has_byte_level(state: dict[str, Any] | None) -> bool:
    if state is None:
        return False
    if state.get("type") == "Sequence":
        return any(_has_byte_level(part) for part in state.get("pretokenizers", []))
    return state.get("type") == "ByteLevel"


def _never_shortens(state: dict[str, Any] | None) -> bool:
    if state is None:
        return True
    kind = state.get("type")
    if kind == "Sequence":
        return all(_never_shortens(part) for part in state.get("normalizers", []))
    if kind == "Prepend":
        return True
    if kind == "Replace":
        pattern = state.get("pattern", {})
        return "String" in pattern and len(state.get("content", "")) >= len(pattern["String"])
    return False
