"""A request body that stops arriving is dropped: ``408 request_timeout`` after ``MILLM_BODY_TIMEOUT_S``.

uvicorn bounds the wait for a request's head and an idle connection between requests
(``timeout_keep_alive``), never the wait for a body that stops short of its
``Content-Length`` (slowloris): the request's task and connection would wait for the
rest for as long as the client holds the socket. Here each wait for the next piece of
the body is bounded, as nginx's ``client_body_timeout`` bounds the time between two
reads; the answer closes the connection. Once the body is complete, waits on the
channel (``http.disconnect`` while a generation runs) are not bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import falcon.asgi

from ..errors import MillmError

Receive = Callable[[], Awaitable[dict[str, Any]]]


class BodyTimeout(MillmError):
    status, code = 408, "request_timeout"


def bounded(receive: Receive, seconds: float) -> Receive:
    """``receive``, whose waits for a piece of the request body end after ``seconds`` with ``BodyTimeout``."""
    complete = False

    async def receive_bounded() -> dict[str, Any]:
        nonlocal complete
        if complete:
            return await receive()
        try:
            async with asyncio.timeout(seconds):
                message = await receive()
        except TimeoutError:
            raise BodyTimeout(
                f"no part of the request body arrived for {seconds:g} s (MILLM_BODY_TIMEOUT_S); "
                "it is shorter than its Content-Length says",
                headers={"Connection": "close"},  # what is left of the body would be read as the next request
            ) from None
        complete = message.get("type") != "http.request" or not message.get("more_body", False)
        return message

    return receive_bounded


class App(falcon.asgi.App):
    """Falcon's ASGI app, whose HTTP requests read their bodies with ``bounded`` waits (0: unbounded)."""

    def __init__(self, *args: Any, body_timeout_s: float = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Any) -> None:  # type: ignore[override]
        if scope.get("type") == "http" and self.body_timeout_s > 0:
            receive = bounded(receive, self.body_timeout_s)
        await super().__call__(scope, receive, send)
