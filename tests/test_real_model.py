"""A few checks on the real default model, SmolLM2-135M-Instruct (transformers, float32)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.real_model

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_default_model_is_served_under_its_name(default_server):
    models = [m.id for m in default_server.openai().models.list().data]
    assert "SmolLM2-135M-Instruct" in models


def test_greedy_answer_mentions_paris(default_server):
    reply = default_server.openai().chat.completions.create(
        model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, max_tokens=30
    )
    assert "Paris" in reply.choices[0].message.content
    assert reply.system_fingerprint == "millm:SmolLM2-135M-Instruct@unrecorded:float32/Q4_1:transformers+continuous"


def test_streamed_text_equals_non_streamed_text(default_server):
    client = default_server.openai()
    request = dict(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Name three colours."}],
        temperature=0,
        max_tokens=40,
    )
    whole = client.chat.completions.create(**request).choices[0].message.content
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **request) if c.choices
    )
    assert streamed == whole


def test_same_seed_same_text_at_temperature_one(default_server):
    client = default_server.openai()
    request = dict(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "Write a short poem."}],
        temperature=1,
        max_tokens=30,
        seed=1234,
    )
    first = client.chat.completions.create(**request).choices[0].message.content
    second = client.chat.completions.create(**request).choices[0].message.content
    assert first == second


def test_stop_sequence_in_a_real_answer(default_server):
    client = default_server.openai()
    deltas = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, max_tokens=30, stop=[" Paris"], stream=True
        )
        if c.choices
    ]
    text = "".join(deltas)
    assert "Paris" not in text and text.startswith("The capital of France is")


def test_serve_a_gguf_path_with_the_transformers_engine(server_factory, tmp_path):
    from millm_host.default_model import default_model_path

    link = tmp_path / "My-Model.Q4_1.gguf"
    link.symlink_to(default_model_path())  # same file: the cached conversion is reused
    server = server_factory(link)
    assert server.model_id == "My-Model"
    reply = server.openai().chat.completions.create(model="My-Model", messages=QUESTION, temperature=0, max_tokens=12)
    assert "Paris" in reply.choices[0].message.content
