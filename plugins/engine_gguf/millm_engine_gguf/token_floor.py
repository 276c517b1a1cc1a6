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

An RWKV vocabulary's tokenizer takes the longest token that matches at each byte, or one
byte as the unknown token: no token covers more bytes than the longest token's text. Its
texts are stored escaped (``\\n``, ``\\xNN``): a normal token is matched by its unescaped
piece, a special one by its stored text, so each counts with the length it is matched by.

A WPM (BERT) vocabulary gets a bound by words instead (``WordFloor``): an unknown word is
one token whatever its length. UGM (T5) vocabularies get none: UGM normalizes the text
first (its character map may drop or merge characters), and makes a run of unknown
characters one token (200,000 characters of "zq" are one), so no count of the text bounds
it. Such a text is tokenized whole; ``vocab`` copies its ids out a slice at a time.
"""

from __future__ import annotations

import ctypes
import re
import string
import time
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
    def of(cls, vocab: llama_cpp.llama_vocab_p, size: int) -> TokenFloor | WordFloor | None:
        """The bound for a llama.cpp vocabulary of ``size`` tokens, or None where none holds."""
        kind = llama_cpp.llama_vocab_type(vocab)
        if kind == llama_cpp.LLAMA_VOCAB_TYPE_WPM:
            return WordFloor.of(vocab, size)
        rwkv = kind == llama_cpp.LLAMA_VOCAB_TYPE_RWKV
        if kind not in (llama_cpp.LLAMA_VOCAB_TYPE_SPM, llama_cpp.LLAMA_VOCAB_TYPE_BPE) and not rwkv:
            return None
        buffer = ctypes.create_string_buffer(1024)
        longest, single_bytes, strips = 0, set(), False
        for token in range(size):
            attributes = llama_cpp.llama_vocab_get_attr(vocab, token)
            if rwkv and not attributes & llama_cpp.LLAMA_TOKEN_ATTR_NORMAL:  # matched by its stored text
                n = len(llama_cpp.llama_vocab_get_text(vocab, token) or b"")
            else:  # matched by its piece (negative: longer than the buffer, llama.cpp says how long)
                n = abs(llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True))
                if n == 1:
                    single_bytes.add(buffer.raw[0])
            longest = max(longest, n)
            strips = strips or bool(
                attributes & (llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP | llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP)
            )
        missing = set() if rwkv else set(range(256)) - single_bytes  # RWKV: a byte without a token is one
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


#: Where llama.cpp's WPM pre-tokenizer always splits: ASCII whitespace (it splits on more; a
#: character counted here as a separator that it kept inside a word would overcount) ...
_WPM_SPACES = " \t\n\r"
#: ... and ASCII punctuation and symbols, each a word of its own (it keeps every one of them).
_WPM_PUNCTUATION = string.punctuation
#: A word that counts: from a separator (or the start), through characters that are neither a
#: separator nor an ASCII letter or digit, to its first ASCII letter or digit (one that
#: normalizing cannot remove). The classes are disjoint, so each match is found in linear time.
_WPM_SEPARATOR = re.escape(_WPM_SPACES + _WPM_PUNCTUATION)
_WPM_WORD = re.compile(f"(?:^|[{_WPM_SEPARATOR}])[^{_WPM_SEPARATOR}A-Za-z0-9]*[A-Za-z0-9]")
#: A vocabulary with more special tokens than this that span several words gets no bound
#: (each is looked for in the text, a pass over it each).
_MOST_MULTIWORD_SPECIALS = 64


@dataclass(frozen=True)
class WordFloor:
    """A lower bound for a WPM (BERT) vocabulary: every word is one token at least.

    llama.cpp splits the text at whitespace and makes each ASCII punctuation or symbol
    character a word of its own; a word becomes its word pieces, or one unknown token. So
    the text has at least as many tokens as it has ASCII punctuation characters plus words
    that hold an ASCII letter or digit (a word of other characters only may be normalized
    away). A special token's text, parsed as one token, may span several such words: each
    occurrence counts one (``str.count`` finds at least as many as llama.cpp matches).
    """

    #: Special tokens' texts that count as more than one word, and how many more.
    specials: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, vocab: llama_cpp.llama_vocab_p, size: int) -> WordFloor | None:
        buffer = ctypes.create_string_buffer(1024)
        specials = []
        for token in range(size):
            if llama_cpp.llama_vocab_get_attr(vocab, token) & llama_cpp.LLAMA_TOKEN_ATTR_NORMAL:
                continue
            n = llama_cpp.llama_token_to_piece(vocab, token, buffer, len(buffer), 0, True)
            if n < 0:
                return None  # a special text over a kilobyte: not worth a bound
            text = buffer.raw[:n].decode("utf-8", "replace")
            extra = _words(text) - 1
            if extra > 0:
                specials.append((text, extra))
        if len(specials) > _MOST_MULTIWORD_SPECIALS:
            return None
        return cls(tuple(specials))

    def tokens(self, texts: Sequence[str]) -> int:
        """At least this many tokens in any text holding all of ``texts``.

        Where two of them meet, the last word of one and the first of the other may be one
        word, or a special token's text may span the join: each join counts that much less.
        """
        counted = 0
        for text in texts:
            words = _words(text) - sum(text.count(special) * extra for special, extra in self.specials)
            counted += max(words, 0)
        join = 1 + max((extra for _, extra in self.specials), default=0)
        return max(counted - join * (len(texts) - 1), 0)


#: Characters one regular-expression call reads (a call holds the GIL: about a millisecond here).
_SLICE = 64 * 1024


def _words(text: str) -> int:
    """Words that count in ``text``, a slice at a time, giving the GIL up between slices.

    A word whose separator and first letter fall on two sides of a cut is not counted: the
    count may come out a word per slice short, never over.
    """
    words = 0
    for start in range(0, len(text), _SLICE):
        end = min(start + _SLICE, len(text))
        words += sum(text.count(c, start, end) for c in _WPM_PUNCTUATION)
        words += sum(1 for _ in _WPM_WORD.finditer(text, start, end))
        time.sleep(0)
    return words
