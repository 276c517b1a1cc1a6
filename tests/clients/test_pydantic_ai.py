"""pydantic-ai on its OpenAI chat model: structured output from an agent that has a tool, streamed.

``NativeOutput`` sends the output schema as ``response_format`` next to the agent's tools (one
grammar for both on the server); the default, a tool output, makes the answer a call to its
``final_result`` tool. Either way the model first calls ``get_weather`` (scripted in the
generic format), then answers once the tool's result is in the conversation.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import pytest
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

WEATHER = {"city": "Paris", "sunny": True}
#: How the model answers in each output mode: the document itself, or a call to the output tool.
ANSWERS = {
    "native": json.dumps(WEATHER),
    "tool": json.dumps({"tool_calls": [{"name": "final_result", "arguments": WEATHER}]}),
}


def get_weather(city: Literal["Paris", "Rome"]) -> str:
    """Get the weather in a city."""
    return f"sunny in {city}"


async def stream(agent: Agent[None, Any]) -> tuple[list[Any], Any]:
    """Every partial output the stream gave, and the validated final one."""
    async with agent.run_stream("What is the weather in Paris?") as result:
        partials = [partial async for partial in result.stream_output(debounce_by=None)]
        return partials, await result.get_output()


@pytest.mark.parametrize("mode", ["native", "tool"])
def test_streamed_structured_output_with_a_tool(server, model, shapes, scripted_turns, mode):
    http = scripted_turns(shapes.GENERIC_CALL, ANSWERS[mode])
    chat = OpenAIChatModel(model, provider=OpenAIProvider(base_url=server.v1, api_key="not-needed", http_client=http))
    output = NativeOutput(shapes.Weather) if mode == "native" else shapes.Weather
    agent: Agent[None, Any] = Agent(chat, output_type=output, tools=[get_weather], retries=0)
    partials, final = asyncio.run(stream(agent))
    assert final == shapes.Weather(city="Paris", sunny=True)
    assert partials and partials[-1] == final
