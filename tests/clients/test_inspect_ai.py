"""inspect-ai: a task whose solver has a tool, parallel tool calls on, through its ``openai-api`` provider.

The task is made here (one sample, no dataset download) and run in-process with ``inspect_ai.eval``.
The model first calls ``get_weather`` twice in one turn (scripted in the generic format), inspect
runs both calls and sends their results back, and the model answers in words; the scorer finds
the answer. inspect writes its log under the test's ``tmp_path``, and the test reads it back.
"""

from __future__ import annotations

import json
from typing import Literal

import inspect_ai
from inspect_ai import Task
from inspect_ai.dataset import Sample
from inspect_ai.log import ModelEvent, read_eval_log
from inspect_ai.model import ChatMessageAssistant, ChatMessageTool, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import Tool, tool

CITIES = ["Paris", "Rome"]
#: Both calls in one turn (the generic format's list, which ``parallel_tool_calls`` allows), then the answer.
CALLS = json.dumps({"tool_calls": [{"name": "get_weather", "arguments": {"city": city}} for city in CITIES]})
ANSWER = "Sunny in Paris and in Rome."

#: The cities the tool was called for.
ASKED: list[str] = []


@tool
def get_weather() -> Tool:
    """The weather tool; it records each city it is asked for."""

    async def execute(city: Literal["Paris", "Rome"]) -> str:
        """Get the weather in a city.

        Args:
            city: The city.
        """
        ASKED.append(city)
        return f"sunny in {city}"

    return execute


def test_task_with_parallel_tool_calls(server, model, scripted_turns, tmp_path, monkeypatch):
    # inspect keeps its traces and sample buffer in the user's data folder: this test's instead.
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    http = scripted_turns(CALLS, json.dumps({"response": ANSWER}))
    served = get_model(f"openai-api/millm/{model}", base_url=server.v1, api_key="not-needed", http_client=http)
    task = Task(
        dataset=[Sample(input="What is the weather in Paris and in Rome?", target=ANSWER)],
        solver=[use_tools(get_weather()), generate()],
        scorer=includes(),
    )
    ASKED.clear()
    (log,) = inspect_ai.eval(
        task, model=served, log_dir=str(tmp_path / "logs"), display="none", parallel_tool_calls=True, max_retries=0
    )
    assert log.status == "success", log.error
    assert log.location.startswith(str(tmp_path / "logs"))

    (sample,) = read_eval_log(log.location).samples or []
    calls, *results, answer = sample.messages[1:]
    assert isinstance(calls, ChatMessageAssistant) and calls.tool_calls is not None
    assert [(call.function, call.arguments) for call in calls.tool_calls] == [
        ("get_weather", {"city": city}) for city in CITIES
    ]
    assert sorted(ASKED) == CITIES
    tool_results = [result for result in results if isinstance(result, ChatMessageTool)]
    assert len(tool_results) == len(results) == len(CITIES)
    assert {(result.tool_call_id, result.text) for result in tool_results} == {
        (call.id, f"sunny in {call.arguments['city']}") for call in calls.tool_calls
    }
    assert isinstance(answer, ChatMessageAssistant) and answer.text == ANSWER
    assert sample.scores is not None and sample.scores["includes"].value == "C"

    # Both requests told the server that parallel calls are allowed.
    requests = [event.call.request for event in sample.events if isinstance(event, ModelEvent) and event.call]
    assert len(requests) == 2 and all(request["parallel_tool_calls"] is True for request in requests)
