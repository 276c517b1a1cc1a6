"""json_schema on the real default model (SmolLM2-135M-Instruct): outputs validate, seed after seed."""

from __future__ import annotations

import json

import jsonschema
import pytest

REVIEW = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "reviewer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 24},
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
            },
            "required": ["name", "stars"],
            "additionalProperties": False,
        },
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 2, "maxItems": 4},
    },
    "required": ["sentiment", "reviewer", "keywords"],
    "additionalProperties": False,
}
PROMPT = [
    {"role": "system", "content": "You turn reviews into JSON."},
    {"role": "user", "content": "Review by Ana: 'Great little cafe, friendly staff, the cake was dry.' 4 stars."},
]


@pytest.mark.real_model
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_json_schema_outputs_validate(default_server, seed):
    client = default_server.openai()
    completion = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=PROMPT,
        max_tokens=200,
        temperature=0.8,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "review", "schema": REVIEW}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), REVIEW)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.real_model
def test_generic_tool_call(default_server):
    """SmolLM2's template takes no tools: the generic format calls the tool, arguments as the schema says."""
    client = default_server.openai()
    completion = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "What is the weather like in Paris right now?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=60,
        temperature=0.0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message.content
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER_TOOL["function"]["parameters"])
    print("default model's call:", arguments)
