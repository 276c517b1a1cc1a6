"""``min_tokens`` for an RWKV vocabulary: bytes over the longest token as matched, never above llama.cpp's count.

The vocabulary is written here as a GGUF file (``gguf``'s writer), its token texts escaped as
llama.cpp's converter escapes them (``repr`` of the bytes), and read by llama.cpp with
``vocab_only``. It has every single byte, some longer pieces (one a piece of a character,
so the greedy match can stop inside one), and a special token whose stored text has escapes:
llama.cpp matches a special token in the text by its stored text, longer than the piece it
decodes to, so a bound from decoded pieces would count too many.
"""

from __future__ import annotations

import gguf
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from millm_engine_gguf.token_floor import TokenFloor
from millm_engine_gguf.vocab import Vocab

#: Matched in the text as these 22 characters (backslash, n, ...); decodes to 13 bytes.
SPECIAL = "<|" + "\\n" * 9 + "|>"
PIECES = [bytes([b]) for b in range(256)] + [
    b"hello",
    b" world",
    b"\n\n",
    "日本".encode(),
    "語".encode()[:2],
    b"abcdefghijklmnop",
]


@pytest.fixture(scope="module")
def vocab(vocab_only):
    """An RWKV6-architecture vocabulary, its texts escaped as llama.cpp's converter escapes them."""
    tokens = [SPECIAL.encode()] + [repr(piece)[2:-1].encode() for piece in PIECES]

    def rwkv6(writer: gguf.GGUFWriter) -> None:
        writer.add_head_count(0)
        writer.add_layer_norm_eps(1e-5)
        writer.add_wkv_head_size(4)
        writer.add_time_mix_extra_dim(4)
        writer.add_time_decay_extra_dim(4)
        writer.add_rescale_every_n_layers(6)

    return vocab_only("rwkv6", "rwkv", tokens, [gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * len(PIECES), rwkv6)


def real_count(vocab: Vocab, text: str, special: bool) -> int:
    return len(vocab.tokenize(text.encode("utf-8", "surrogatepass"), special))


def test_an_rwkv_vocabulary_gets_a_bound_by_bytes(vocab):
    floor = TokenFloor.of(vocab.vocab, vocab.size)
    assert isinstance(floor, TokenFloor)
    assert floor.per_token == len(SPECIAL) and floor.by_bytes
    assert real_count(vocab, SPECIAL * 100, True) == 100  # the special token, matched by its stored text
    assert floor.tokens([SPECIAL * 100]) == 100
    text = "hello world" * 20_000
    assert floor.tokens([text]) == -(-len(text) // len(SPECIAL)) <= real_count(vocab, text, True)


PIECE = st.sampled_from(
    [
        SPECIAL,
        "hello",
        " world",
        "\n\n",
        "\n",
        "日本",
        "語",
        "日本語",
        "abcdefghijklmnopq",
        "\\",
        "\\n",
        "\x00",
        "é",
        "🙂",
    ]
)
TEXT = st.lists(PIECE | st.text(max_size=8), max_size=40).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXT, min_size=1, max_size=3), special=st.booleans())
def test_the_byte_bound_never_exceeds_the_real_token_count(vocab, texts, special):
    floor = TokenFloor.of(vocab.vocab, vocab.size)
    assert floor is not None
    assert floor.tokens(texts) <= real_count(vocab, "".join(texts), special)
