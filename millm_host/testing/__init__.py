"""Helpers for tests of millm and its plugins: an in-process app on the echo engine, a real
server process, tiny models, and one helper per job (requests, error checks, SSE)."""

from .helpers import (
    BODY_LIMIT,
    HEALTH_BOUND_S,
    assert_error,
    chat,
    chat_body,
    health_while,
    just_under_the_limit,
    run_together,
    sse_events,
    stream_post,
)
from .inprocess import AppServer
from .server import ServerProcess, free_port, shared_cache_dir

__all__ = [
    "BODY_LIMIT",
    "HEALTH_BOUND_S",
    "run_together",
    "AppServer",
    "ServerProcess",
    "assert_error",
    "chat",
    "chat_body",
    "free_port",
    "health_while",
    "just_under_the_limit",
    "shared_cache_dir",
    "sse_events",
    "stream_post",
]
