"""``min_tokens`` for a WPM (BERT) vocabulary: a bound by words, never above llama.cpp's real count.

The vocabulary is written here as a GGUF file (``gguf``'s writer) and read by llama.cpp with
``vocab_only``: word pieces for some words, so others are unknown (one token a word, the
case the bound must still hold in), special tokens whose text spans several words, and a
text of ASCII punctuation, whitespace, control characters and non-ASCII letters.
"""

from __future__ import annotations

import gguf
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from millm_engine_gguf.token_floor import TokenFloor, WordFloor

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PIECES = [
    "\u2581hello",
    "\u2581world",
    "##s",
    "\u2581a",
    "\u2581b",
    "##a",
    "##b",
    "!",
    ",",
    "\u2581un",
    "##known",
    "\u00e9",
]


@pytest.fixture(scope="module")
def vocab(vocab_only):
    """A BERT-architecture vocabulary: word pieces, and BERT's special tokens."""
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL

    def bert(writer: gguf.GGUFWriter) -> None:
        writer.add_head_count(2)
        writer.add_layer_norm_eps(1e-12)
        writer.add_causal_attention(False)
        writer.add_pad_token_id(0)
        writer.add_unk_token_id(1)
        writer.add_bos_token_id(2)
        writer.add_eos_token_id(3)
        writer.add_sep_token_id(3)  # llama.cpp asserts on it when it adds BERT's [CLS] ... [SEP]
        writer.add_mask_token_id(4)

    return vocab_only("bert", "bert", SPECIALS + PIECES, [control] * len(SPECIALS) + [normal] * len(PIECES), bert)


PIECE = st.sampled_from(
    [
        *SPECIALS,
        "hello",
        "worlds",
        "unknown",
        "a",
        "b",
        "ab",
        "é",
        "éa",
        " ",
        "  ",
        "\t",
        "\n",
        "\x1c",
        "\x00",
        "\u200b",
        "!",
        ",",
        "-",
        "'",
        "~",
        "[",
        "]",
        "日本",
        "\u00a0",
        "\u0301",
        "ﬁ",
        "A1",
        "9",
    ]  # fmt: skip
)
TEXT = st.lists(PIECE | st.text(max_size=8), max_size=40).map("".join)


def test_a_wpm_vocabulary_gets_a_bound_by_words(vocab):
    floor = TokenFloor.of(vocab.vocab, vocab.size)
    assert isinstance(floor, WordFloor)
    assert dict(floor.specials) == {special: 2 for special in SPECIALS}  # "[", the word, "]": one token
    assert floor.tokens(["hello, world!"]) == 4
    # a word whose separator and letter a slice's cut divides is not counted: a few short, never over
    assert 100_000 - 4 <= floor.tokens(["a " * 100_000]) <= 100_000


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXT, min_size=1, max_size=3), special=st.booleans())
def test_the_word_bound_never_exceeds_the_real_token_count(vocab, texts, special):
    floor = TokenFloor.of(vocab.vocab, vocab.size)
    assert floor is not None
    assert floor.tokens(texts) <= len(vocab.tokenize("".join(texts).encode("utf-8", "surrogatepass"), special))
