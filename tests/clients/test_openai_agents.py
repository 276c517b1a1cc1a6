"""The OpenAI Agents SDK: an agent with a function tool, streamed, on its chat-completions and Responses models.

Each run is the whole agent loop: the model calls ``get_weather`` (scripted in the generic
format), the SDK runs the tool and sends its result back, and the model answers in words.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.stream_events import RunItemStreamEvent
from openai import AsyncOpenAI

# The SDK would otherwise export its traces to OpenAI's servers.
set_tracing_disabled(True)

#: The cities the tool was called for.
ASKED: list[str] = []


@function_tool
def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """Get the weather in a city."""
    ASKED.append(city)
    return f"sunny in {city}"


@pytest.fixture
def client(server, scripted_turns, shapes) -> AsyncOpenAI:
    """A client per test: its connections belong to the event loop of that test's ``asyncio.run``."""
    http = scripted_turns(shapes.GENERIC_CALL, shapes.GENERIC_ANSWER)
    return AsyncOpenAI(base_url=server.v1, api_key="not-needed", max_retries=0, http_client=http)


async def run_streamed(agent: Agent[Any]) -> tuple[list[str], Any]:
    """The names of the run items the stream announced, and the final output."""
    result = Runner.run_streamed(agent, "What is the weather in Paris?", run_config=RunConfig(tracing_disabled=True))
    names = [event.name async for event in result.stream_events() if isinstance(event, RunItemStreamEvent)]
    return names, result.final_output


@pytest.mark.parametrize("kind", ["chat_completions", "responses"])
def test_streamed_agent_calls_its_tool(client, model, kind):
    chosen = OpenAIChatCompletionsModel if kind == "chat_completions" else OpenAIResponsesModel
    agent: Agent[Any] = Agent(name="weather", model=chosen(model=model, openai_client=client), tools=[get_weather])
    ASKED.clear()
    names, final = asyncio.run(run_streamed(agent))
    assert ASKED == ["Paris"]
    assert names == ["tool_called", "tool_output", "message_output_created"]
    assert final == "Sunny in Paris."
