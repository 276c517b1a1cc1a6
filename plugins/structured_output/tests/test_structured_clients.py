"""Structured output as clients ask for it, through a real ``millm serve`` on the tiny random model.

The openai SDK's ``parse`` and ``stream`` helpers send pydantic models (dates,
UUIDs, sets, Literal, Enum, Optional, nested models, dicts) and read the reply
back into them; instructor's ``JSON_SCHEMA`` mode sends ``model_json_schema()``
as it is. A random model writes whatever the constraint allows, so the replies
that read back prove the constraint; ``X-Test-Scripted-Output`` makes the model
write a given document where free text would run to ``max_tokens``.
"""

from __future__ import annotations

import json
from typing import Literal

import pydantic
import pytest

from millm_scripted_output import HEADER, encode

from .pydantic_models import BOOKING, Booking, Guest, Slot, as_model_writes

MESSAGES = [{"role": "user", "content": "Book a room."}]
SEEDS = [0, 1, 2]


@pytest.fixture(scope="module")
def server(server_factory, tiny_model_dir):
    return server_factory(tiny_model_dir, env={"SCRIPTED_OUTPUT_ENABLED": "true"})


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


@pytest.fixture(scope="module")
def model(server):
    return server.model_id


def scripted(text: str) -> dict[str, str]:
    return {HEADER: encode(text)}


def test_parse_reads_back_every_common_type(client, model):
    completion = client.chat.completions.parse(
        model=model,
        messages=MESSAGES,
        response_format=Booking,
        max_tokens=300,
        extra_headers=scripted(as_model_writes(BOOKING)),
    )
    assert completion.choices[0].message.parsed == BOOKING


def test_stream_reads_back_every_common_type_and_reports_it_valid(client, model):
    with client.chat.completions.stream(
        model=model,
        messages=MESSAGES,
        response_format=Booking,
        max_tokens=300,
        extra_headers=scripted(as_model_writes(BOOKING)),
    ) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == BOOKING
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # streamed, not sent whole
    verdicts = [c.model_extra["millm_validation"] for c in chunks if "millm_validation" in (c.model_extra or {})]
    assert verdicts == [[{"index": 0, "status": "valid"}]]


@pytest.mark.parametrize("seed", SEEDS)
def test_parse_on_what_the_model_writes(client, model, seed):
    completion = client.chat.completions.parse(
        model=model, messages=MESSAGES, response_format=Slot, max_tokens=300, temperature=1.0, seed=seed
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, Slot)


@pytest.mark.parametrize("seed", SEEDS)
def test_stream_on_what_the_model_writes(client, model, seed):
    with client.chat.completions.stream(
        model=model, messages=MESSAGES, response_format=Slot, max_tokens=300, temperature=1.0, seed=seed
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert isinstance(final.choices[0].message.parsed, Slot)


class Judge(pydantic.BaseModel):
    label: Literal["humor", "not_humor"]
    sure: bool


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("model_class", [Judge, Slot])
def test_no_padding_keys_for_a_schema_as_pydantic_writes_it(client, model, seed, model_class):
    """instructor's JSON_SCHEMA mode sends model_json_schema() itself, without additionalProperties: only its keys."""
    schema = model_class.model_json_schema()
    assert "additionalProperties" not in schema
    completion = client.chat.completions.create(
        model=model,
        messages=MESSAGES,
        max_tokens=300,
        temperature=1.0,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": model_class.__name__, "schema": schema}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    document = json.loads(choice.message.content)
    assert set(document) <= set(model_class.model_fields)
    if model_class is Slot:
        assert set(document["organiser"]) <= set(Guest.model_fields)
    model_class.model_validate(document)
