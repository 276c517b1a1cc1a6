"""``TokenFloor``: a true lower bound on the tokens of a text where it is given, None where none holds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from millm_engine_transformers.token_span import TokenFloor
from millm_host.testing.tiny_models import tiny_llama


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_llama()))


def test_a_byte_level_bpe_is_bounded_by_its_longest_entry(tiny_tokenizer):
    floor = TokenFloor.of(tiny_tokenizer)
    assert floor is not None and floor.per_token == max(len(t) for t in tiny_tokenizer.get_vocab())
    for dropped in floor.dropped:  # bytes the vocabulary lacks: not counted, as the tokenizer drops them
        assert tiny_tokenizer(dropped * 10, add_special_tokens=False)["input_ids"] == []
        assert floor.tokens([dropped * 10]) == 0


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(max_size=100), min_size=1, max_size=4))
def test_no_text_has_fewer_tokens_than_the_floor(tiny_tokenizer, texts):
    floor = TokenFloor.of(tiny_tokenizer)
    special = max(tiny_tokenizer.all_special_tokens, key=len)
    for sample in (texts, [special * 3, *texts]):
        tokens = tiny_tokenizer("".join(sample), add_special_tokens=False)["input_ids"]
        assert len(tokens) >= floor.tokens(sample)


def _fast(model, normalizer=None, pre_tokenizer=None) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(model)
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    if pre_tokenizer is not None:
        tokenizer.pre_tokenizer = pre_tokenizer
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer)


def test_no_floor_where_a_token_may_cover_more_than_its_string():
    wordpiece = _fast(
        models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"), pre_tokenizer=pre_tokenizers.Whitespace()
    )
    assert TokenFloor.of(wordpiece) is None  # [UNK] is a whole word
    bpe_with_unk = _fast(models.BPE({"a": 0, "<unk>": 1}, [], unk_token="<unk>", fuse_unk=True))
    assert TokenFloor.of(bpe_with_unk) is None  # a fused unknown token is any run of characters
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe = models.BPE({c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}, [])
    assert TokenFloor.of(_fast(bpe, pre_tokenizer=byte_level)) == TokenFloor(1)
    composing = _fast(bpe, normalizer=normalizers.NFKC(), pre_tokenizer=byte_level)
    assert TokenFloor.of(composing) is None  # normalization may join characters
    llama2 = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    assert TokenFloor.of(_fast(bpe, normalizer=llama2, pre_tokenizer=byte_level)) == TokenFloor(1)
