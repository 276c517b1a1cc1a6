"""A UGM vocabulary (T5's unigram, as XLM-RoBERTa embedders convert): no token bound, so long texts are tokenized.

llama.cpp merges a run of unknown characters into one token, and normalizes the text first,
so no count of a text bounds its tokens from below (``token_floor``). A 4 MiB prompt is
tokenized whole before it is refused: its millions of ids must be copied out of llama.cpp
and freed a slice at a time (``vocab``), not in one C call that holds the GIL for tens of ms.
The server is a real ``millm serve --engine gguf`` on a tiny random model (``tiny_ugm_gguf``).
"""

from __future__ import annotations

import json

import httpx
import pytest

from millm_engine_gguf.token_floor import TokenFloor
from millm_host.bodies import release as graveyard
from millm_host.testing import BODY_LIMIT, HEALTH_BOUND_S, assert_error, health_while
from millm_host.testing.tiny_models import tiny_ugm_gguf

from .conftest import THREADS

#: One id per character: "ab" is no piece of the tiny vocabulary ("▁ab" is).
LONG_TEXT = "ab" * ((BODY_LIMIT - 200) // 2)


@pytest.fixture(scope="module")
def ugm_path(tmp_path_factory: pytest.TempPathFactory):
    return tiny_ugm_gguf(tmp_path_factory.mktemp("ugm-models"))


@pytest.fixture(scope="module")
def vocab(open_vocab, ugm_path):
    return open_vocab(ugm_path)


@pytest.fixture(scope="module")
def ugm_server(server_factory, ugm_path):
    return server_factory(model=str(ugm_path), env=THREADS, args=["--engine", "gguf"])


def test_a_ugm_vocabulary_has_no_bound_as_unknown_runs_are_one_token(vocab):
    assert TokenFloor.of(vocab.vocab, vocab.size) is None
    assert vocab.tokenize(b"zq" * 100_000, False) == [2]  # 200,000 characters, one unknown token


def test_a_long_text_s_ids_are_copied_whole_and_freed_by_the_graveyard(vocab):
    ids = vocab.tokenize(LONG_TEXT.encode(), False)
    assert len(ids) == len(LONG_TEXT) and ids[:2] == ids[-2:] == [4, 5]  # "a", "b"
    assert graveyard.keeps(ids)  # to free it in slices once the caller drops it


@pytest.mark.parametrize(
    ("path", "fields", "message"),
    [
        ("/v1/completions", {"prompt": LONG_TEXT, "max_tokens": 1}, "in the prompt"),
        ("/v1/embeddings", {"input": LONG_TEXT}, "input[0] ("),
    ],
)
def test_a_4_mib_text_is_refused_while_health_answers(ugm_server, path, fields, message):
    body = json.dumps({"model": ugm_server.model_id, **fields}).encode()
    response, slowest = health_while(ugm_server, "POST", path, body)
    assert_error(response, 400, "context_length_exceeded")
    assert f"{len(LONG_TEXT) + 1}" in response.json()["error"]["message"]  # and the end token UGM adds
    assert message in response.json()["error"]["message"]
    assert slowest < HEALTH_BOUND_S, f"/api/health took {slowest:.2f} s"
    with httpx.Client(base_url=ugm_server.base_url, timeout=30) as http:
        served = http.post("/v1/completions", json={"model": ugm_server.model_id, "prompt": "hello", "max_tokens": 2})
    assert served.status_code == 200, served.text
