"""Response bodies are encoded as JSON in bounded pieces, large ones off the event loop (issue 11 §0).

Falcon's handler encoded ``resp.media`` in one ``json.dumps`` call on the event
loop: 256 embeddings of 576 floats held it about 90 ms. ``millm_host.bodies.encode``
gives the same bytes a piece at a time, on a worker thread.
"""

from __future__ import annotations

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor

from hypothesis import given, settings, strategies as st

from millm_host.bodies import encode as jsonencode
from millm_host.bodies.encode import BUDGET, encoded

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=12) | st.dictionaries(st.text(max_size=8), inner, max_size=8),
    max_leaves=200,
)


@settings(max_examples=100, deadline=None)
@given(values)
def test_pieces_give_what_json_dumps_gives(value):
    assert encoded(value) == json.dumps(value, ensure_ascii=False).encode()


@settings(max_examples=75, deadline=None)
@given(values)
def test_pieces_give_what_json_dumps_gives_when_every_value_is_cut(value):
    saved = jsonencode.BUDGET, jsonencode.SLICE
    jsonencode.BUDGET, jsonencode.SLICE = 2, 3  # every container larger than two scalars is cut
    try:
        assert encoded(value) == json.dumps(value, ensure_ascii=False).encode()
        assert encoded(value, compact=True) == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    finally:
        jsonencode.BUDGET, jsonencode.SLICE = saved


@settings(max_examples=50, deadline=None)
@given(st.text(min_size=513) | st.text(alphabet='"\\\n\x00\u2028é日😀a', min_size=513, max_size=3000))
def test_a_long_string_is_encoded_in_slices_as_json_dumps_encodes_it_whole(text):
    """/detokenize of 500,000 ids answers a 3.4 MB string: encoded whole it held the GIL 16-23 ms."""
    saved = jsonencode.BUDGET, jsonencode.STRING_SLICE
    jsonencode.BUDGET, jsonencode.STRING_SLICE = 2, 7  # over the budget at 512 characters; cut every 7
    try:
        for value in (text, {"prompt": text}, [text, 1]):
            assert encoded(value) == json.dumps(value, ensure_ascii=False).encode()
            assert encoded(value, compact=True) == json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    finally:
        jsonencode.BUDGET, jsonencode.STRING_SLICE = saved


def test_non_string_keys_and_tuples_are_written_as_json_dumps_writes_them():
    value = {1: (1.5, "é"), None: [True] * 5000, 2.5: {"x": list(range(5000))}}
    assert encoded(value) == json.dumps(value, ensure_ascii=False).encode()


def embeddings_body(inputs: int = 256, width: int = 576) -> dict:
    data = [
        {"object": "embedding", "index": i, "embedding": [math.sin(i + k) for k in range(width)]} for i in range(inputs)
    ]
    return {"object": "list", "data": data, "model": "m", "usage": {"prompt_tokens": 1, "total_tokens": 1}}


def test_no_dumps_call_encodes_more_than_the_budget(monkeypatch):
    widest = [0]
    dumps = jsonencode._dumps

    def counting(value):
        widest[0] = max(widest[0], BUDGET * 1000 - jsonencode._left_after(value, BUDGET * 1000))
        return dumps(value)

    monkeypatch.setattr(jsonencode, "_dumps", counting)
    monkeypatch.setattr(jsonencode, "_compact_dumps", counting)
    body = embeddings_body()
    assert encoded(body) == json.dumps(body, ensure_ascii=False).encode()
    assert 0 < widest[0] <= BUDGET, widest[0]


def test_a_large_response_body_is_encoded_off_the_event_loop(app_factory, monkeypatch):
    app = app_factory(env={"EMBEDDINGS_MAX_INPUTS": "256"})
    threads = []
    real = jsonencode.encoded

    def recording(value):
        threads.append(threading.get_ident())
        return real(value)

    monkeypatch.setattr(jsonencode, "encoded", recording)
    with app.http() as http:
        small = http.post("/v1/embeddings", json={"model": app.model_id, "input": "hi"})
        assert small.status_code == 200 and not threads  # a small body is encoded at once
        loop_thread = threading.get_ident()
        response = http.post("/v1/embeddings", json={"model": app.model_id, "input": ["word"] * 256})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 256
    assert threads and all(thread != loop_thread for thread in threads), threads


def test_a_large_stream_chunk_is_encoded_off_the_event_loop(monkeypatch):
    import asyncio

    from millm_host.resources import serving

    threads = []
    real = serving.encoded

    def recording(value, **kwargs):
        threads.append(threading.get_ident())
        return real(value, **kwargs)

    monkeypatch.setattr(serving, "encoded", recording)
    big = {"choices": [{"index": 0, "delta": {}}], "millm_probe_verdicts": [{"score": i / 7} for i in range(3000)]}

    async def chunks():
        yield {"choices": [{"index": 0, "delta": {"content": "hi"}}]}
        yield big
        yield "[DONE]"

    async def read() -> tuple[list[bytes], int]:
        return [event.data async for event in serving._events(chunks())], threading.get_ident()

    with ThreadPoolExecutor(1) as pool:  # a loop of its own: a browser test may have left one running here
        data, loop_thread = pool.submit(asyncio.run, read()).result()
    assert data[1] == json.dumps(big, separators=(",", ":"), ensure_ascii=False).encode()
    assert data[0] == b'{"choices":[{"index":0,"delta":{"content":"hi"}}]}' and data[2] == b"[DONE]"
    assert len(threads) == 1 and threads[0] != loop_thread
