"""A few client checks on the real default model, SmolLM2-135M-Instruct, as a new user would run them."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

pytestmark = pytest.mark.real_model

MODEL = "SmolLM2-135M-Instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class Capital(BaseModel):
    city: Literal["Paris", "London", "Berlin"]


class Answer(BaseModel):
    capital: str


def test_hf_id_and_stream_helper(default_server):
    """The model's HF id is an alias; the stream helper sees the text and the usage (issue 12 §1, §4)."""
    with default_server.openai().chat.completions.stream(
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        messages=QUESTION,
        temperature=0,
        max_tokens=20,
        stream_options={"include_usage": True},
    ) as stream:
        final = stream.get_final_completion()
    assert "Paris" in final.choices[0].message.content
    assert final.usage is not None and final.usage.completion_tokens > 0


def test_langchain_tools_on_a_template_without_tools(default_server):
    """SmolLM2's template takes no tools: the generic format serves them (issue 12 §2)."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=default_server.v1, api_key="not-needed", max_retries=0, temperature=0)
    capital = llm.with_structured_output(Capital, method="function_calling").invoke(QUESTION)
    assert isinstance(capital, Capital)


def test_instructor_json_schema_stops_after_the_listed_keys(default_server):
    """No padding keys: the object closes after ``capital`` instead of running to max_tokens (issue 12 §3)."""
    import instructor

    client = instructor.from_openai(default_server.openai(), mode=instructor.Mode.JSON_SCHEMA)
    answer = client.chat.completions.create(
        model=MODEL, messages=QUESTION, response_model=Answer, temperature=0, max_tokens=60, max_retries=0
    )
    assert isinstance(answer, Answer) and answer.capital


def test_langchain_embeddings_with_defaults(default_server):
    from langchain_openai import OpenAIEmbeddings

    embeddings = OpenAIEmbeddings(model=MODEL, base_url=default_server.v1, api_key="not-needed", max_retries=0)
    vectors = embeddings.embed_documents(["The capital of France is Paris.", "Bonjour"])
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) == 576  # SmolLM2-135M's hidden size
