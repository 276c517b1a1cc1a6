"""``TokenFloor``: a true lower bound on the tokens of a text where it is given, None where none holds."""

from __future__ import annotations

import json
import unicodedata

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from millm_engine_transformers import nfc
from millm_engine_transformers.token_span import TokenFloor
from millm_host.testing import BODY_LIMIT, HEALTH_BOUND_S, assert_error, health_while
from millm_host.testing.tiny_models import tiny_llama

#: Characters NFC composes, decomposes or leaves: combining marks, Hangul jamo (L, V, T) and a syllable,
#: Indic vowel signs that are the second of a composition, a singleton (the Angstrom sign),
#: a character whose decomposition is marks alone (Tibetan II), an emoji and an unassigned code point.
COMPOSING = (
    "ae\u0301\u0308\u0327\u1100\u1161\u11a8\uac00\u0b47\u0b3e\u0b57\u212b\u0f73\u0f71\U0001f600\U000e0080\u0345 "
)


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_llama()))


@pytest.fixture(scope="module")
def tiny_floor(tiny_tokenizer):
    """The floor, read once: ``TokenFloor.of`` reads the whole vocabulary (50 ms), too slow for every example."""
    return TokenFloor.of(tiny_tokenizer)


def test_a_byte_level_bpe_is_bounded_by_its_longest_entry(tiny_tokenizer):
    floor = TokenFloor.of(tiny_tokenizer)
    assert floor is not None and floor.per_token == max(len(t) for t in tiny_tokenizer.get_vocab())
    for dropped in floor.dropped:  # bytes the vocabulary lacks: not counted, as the tokenizer drops them
        assert tiny_tokenizer(dropped * 10, add_special_tokens=False)["input_ids"] == []
        assert floor.tokens([dropped * 10]) == 0


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(st.text(max_size=100), min_size=1, max_size=4))
def test_no_text_has_fewer_tokens_than_the_floor(tiny_tokenizer, tiny_floor, texts):
    special = max(tiny_tokenizer.all_special_tokens, key=len)
    for sample in (texts, [special * 3, *texts]):
        tokens = tiny_tokenizer("".join(sample), add_special_tokens=False)["input_ids"]
        assert len(tokens) >= tiny_floor.tokens(sample)


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


@pytest.fixture(scope="module")
def nfc_tokenizer():
    return AutoTokenizer.from_pretrained(str(tiny_llama(nfc=True)))


@pytest.fixture(scope="module")
def nfc_floor(nfc_tokenizer):
    return TokenFloor.of(nfc_tokenizer)


def test_an_nfc_normalized_byte_level_bpe_is_bounded_by_what_nfc_keeps(nfc_tokenizer, tiny_tokenizer):
    floor, plain = TokenFloor.of(nfc_tokenizer), TokenFloor.of(tiny_tokenizer)
    assert plain is not None and floor == TokenFloor(plain.per_token, plain.dropped, nfc=True)
    assert nfc.mergeable("plain ASCII") == 0 and nfc.mergeable("日本語 😀 é") == 0
    assert nfc.mergeable("e\u0301") == 1 == len(unicodedata.normalize("NFC", "e\u0301"))
    assert nfc.mergeable("\u1100\u1161\u11a8") == 2  # three jamo compose into one syllable
    assert floor.tokens(["e\u0301" * 1000]) == -(-1000 // floor.per_token)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(alphabet=COMPOSING, max_size=60) | st.text(max_size=30), min_size=1, max_size=4))
def test_no_nfc_normalized_text_has_fewer_tokens_than_the_floor(nfc_tokenizer, nfc_floor, texts):
    tokens = nfc_tokenizer("".join(texts), add_special_tokens=False)["input_ids"]
    assert len(tokens) >= nfc_floor.tokens(texts)
    assert len(unicodedata.normalize("NFC", "".join(texts))) >= sum(len(t) - nfc.mergeable(t) for t in texts)


def test_a_4_mib_prompt_to_an_nfc_model_is_refused_from_the_bound(server_factory):
    """Before the bound, it was tokenized whole (7 s here for 4 MiB) and then refused by its count."""
    server = server_factory(tiny_llama(nfc=True))
    prompt = "e\u0301 日本 " * ((BODY_LIMIT - 200) // 11)  # 11 bytes of UTF-8
    body = json.dumps({"model": server.model_id, "prompt": prompt, "max_tokens": 1}, ensure_ascii=False).encode()
    response, slowest = health_while(server, "POST", "/v1/completions", body)
    error = assert_error(response, 400, "context_length_exceeded")
    assert "you requested at least" in error["message"]
    assert slowest < HEALTH_BOUND_S, f"/api/health took {slowest:.2f} s"
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        served = http.post("/v1/completions", json={"model": server.model_id, "prompt": "e\u0301", "max_tokens": 2})
    assert served.status_code == 200, served.text
