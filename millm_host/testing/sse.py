"""Reading server-sent events the way an OpenAI client does, for tests."""

from __future__ import annotations

import json
from typing import Any

import httpx


def sse_events(response: httpx.Response) -> list[Any]:
    """The ``data:`` payloads of an SSE response: dicts, and the string ``[DONE]``."""
    events: list[Any] = []
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def stream_post(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    """POST a streamed request; the response (read to its end) and its events ([] on an error status)."""
    with client.stream("POST", path, json=body) as response:
        response.read()
        return response, sse_events(response) if response.status_code == 200 else []
