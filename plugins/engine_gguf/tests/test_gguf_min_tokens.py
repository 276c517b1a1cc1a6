"""``min_tokens`` on the GGUF engine: a lower bound on llama.cpp's token count, from the vocabulary alone.

The host refuses a text that cannot fit the window from it, before tokenizing (4 MiB took
the tokenizer seconds); a bound above the real count would refuse a prompt that fits.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from millm_engine_gguf.engine import GGUFEngine
from millm_engine_gguf.settings import SETTINGS
from millm_engine_gguf.spec import describe
from millm_host.settings import HOST_SETTINGS, Settings

from .conftest import THREADS

#: Text that stresses the bound: bytes the vocabulary lacks, whitespace, SPM's "▁", special tokens' text.
TRICKY = st.sampled_from(["\x04", "\x06", "\x13", "\x1d", " ", "\n", "\t", "\u2581", "<|im_start|>", "<|endoftext|>"])
#: Runs of one tricky piece too: a short text's bound is a token or two, too small to be wrong.
RUN = st.tuples(TRICKY | st.sampled_from(["\U000f0000", "é", "ab"]), st.integers(1, 300)).map(
    lambda run: run[0] * run[1]
)
TEXT = st.lists(
    st.text(max_size=40) | TRICKY | RUN | st.text(alphabet="ab é😀\U000f0000", max_size=20), max_size=12
).map("".join)


@pytest.fixture(scope="module")
def engine(gguf_path):
    engine = GGUFEngine.load(
        describe(str(gguf_path)),
        Settings((*HOST_SETTINGS, *SETTINGS), environ={**THREADS, "GGUF_N_CTX": "256"}),
        lambda _: None,
    )
    yield engine
    engine.close()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(TEXT, min_size=1, max_size=3), special=st.booleans())
def test_the_bound_never_exceeds_the_real_token_count(engine, texts, special):
    text = "".join(texts)
    assert engine.min_tokens(texts) <= len(engine.tokenize(text, add_special_tokens=special))


def test_text_that_cannot_fit_has_a_bound_past_the_window(engine):
    assert engine.min_tokens(["a " * 200_000]) > 256
    assert engine.min_tokens([""]) == 0
