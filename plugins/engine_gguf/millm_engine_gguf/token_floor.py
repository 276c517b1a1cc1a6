"""A cheap lower bound on the tokens llama.cpp makes of a text (``Engine.min_tokens``), from its vocabulary.

The host refuses a text that cannot fit the window from this bound, without tokenizing
it (4 MiB took the tokenizer seconds). A token covers at most as many bytes of text as
its own piece has (the longest piece, control and special tokens' text included), so a
text is at least its bytes over that many tokens. That holds for llama.cpp's SPM and BPE
tokenizers, which never shorten a text first, with these exceptions, each allowed for:

- a byte with no token of its own is dropped by BPE. An ASCII one (SmolLM2's vocabulary
  lacks six control bytes) is not counted. A missing lead byte of a multi-byte character
  (SmolLM2 lacks 0xF1-0xF4) drops one byte of it: the bound then counts characters, not
  bytes, each of which keeps a byte at least. A missing continuation byte: no bound;
- SPM stands for a space by "▁" (3 bytes) and its pieces decode it as a space, so a
  "▁" in the text counts as one byte;
- a special token with the lstrip or rstrip attribute swallows the whitespace beside it,
  however long: where the vocabulary has one, whitespace is not counted.

WPM (BERT), UGM (T5) and RWKV vocabularies get no bound: an unknown word is one token,
and UGM normalizes the text first.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp

#: Whitespace llama.cpp's lstrip/rstrip swallows (C's isspace).
_WHITESPACE = " \t\n\v\f\r"
_SPM_SPACE = "\u2581"
#: Bytes that begin a multi-byte character in valid UTF-8.
_LEAD_BYTES = range(0xC2, 0xF5)
_CONTINUATION_BYTES = range(0x80, 0xC0)


@dataclass(frozen=True)
class TokenFloor:
    #: The most bytes (``by_bytes``) or characters one token covers.
    per_token: int
    #: Count the text's UTF-8 bytes (else its characters, each of which keeps a byte at least).
    by_bytes: bool
    #: Characters not counted (bytes the vocabulary lacks, whitespace a strip token may swallow).
    uncounted: str = ""
    #: SPM: a "▁" in the text counts as one byte (its pieces decode it as a space).
    spm: bool = False

    @classmethod
    def of(cls, vocab: llama_cpp.llama_vocab_p, size: int) -> TokenFloor | None:
        """The bound for a llama.cpp vocabulary of ``size`` tokens, or None where none holds."""
        kind = llama_cpp.llama_vocab_type(vocab)
        if kind not in (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE):
            return None
        buffer = ctypes.create_string_buffer(1024)
        longest, single_bytes, strips = 0, set(), False
        for token in range(size):
            n = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True)
            if n < 0:  # longer than the buffer: llama.cpp says how long
                n = -n
            longest = max(longest, n)
            if n == 1:
                single_bytes.add(buffer.raw[0])
            strips = strips or bool(
                llama_cpp.llama_vocab_get_attr(vocab, token)
                & (llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP)
            )
        missing = set(range(256)) - single_bytes
        if longest == 0 or missing & set(_CONTINUATION_BYTES):
            return None
        uncounted = "".join(chr(b) for b in sorted(missing) if b < 0x80) + (_WHITESPACE if strips else "")
        by_bytes = not missing & set(_LEAD_BYTES)
        return cls(longest, by_bytes, "".join(dict.fromkeys(uncounted)), kind == llama_cpp.LLAMA_VOCAB_TYPE_SPM)

    def tokens(self, texts: Sequence[str]) -> int:
        """At least this many tokens in any text holding all of ``texts``."""
        counted = 0
        for text in texts:
            size = len(text.encode("utf-8", "surrogatepass")) if self.by_bytes and not text.isascii() else len(text)
            size -= sum(text.count(c) for c in self.uncounted)
            if self.spm and self.by_bytes:
                size -= 2 * text.count(_SPM_SPACE)
            counted += max(size, 0)
        return -(-counted // self.per_token)
