"""Running a prepared generation request: the whole answer, or a stream of chunks."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from ..context import RequestContext
from ..errors import RequestCancelled
from ..output import ResponseExtra
from .generation import GenerationJob, flatten
from .pipeline import Admission, raise_for
from .responses import chunk, completion_body, delta_choice, usage

if TYPE_CHECKING:
    from ..app import Host

log = logging.getLogger("millm.serving")

DONE = "[DONE]"


def collect_headers(host: Host, ctx: RequestContext) -> dict[str, str]:
    headers: dict[str, str] = {}
    for result in host.pm.hook.render_headers(ctx=ctx):
        if result:
            headers.update(result)
    return headers


def collect_extras(host: Host, ctx: RequestContext) -> list[ResponseExtra]:
    extras = [e for e in flatten(host.pm.hook.response_extras(ctx=ctx)) if isinstance(e, ResponseExtra)]
    return sorted(extras, key=lambda e: e.order)


def add_extras(host: Host, ctx: RequestContext, body: dict[str, Any]) -> dict[str, Any]:
    """Merge every plugin's body extras into a non-streamed ``body``, in order."""
    for extra in collect_extras(host, ctx):
        body.update(extra.fields)
    return body


async def complete(host: Host, ctx: RequestContext, admission: Admission) -> tuple[dict[str, Any], dict[str, str]]:
    """Generate the whole answer; return the body and the response headers."""
    try:
        await host.scheduler.run(GenerationJob(host, ctx), cancel=ctx.cancel_event)
    finally:
        admission.release()
    return add_extras(host, ctx, completion_body(ctx)), collect_headers(host, ctx)


async def stream(
    host: Host, ctx: RequestContext, admission: Admission
) -> AsyncGenerator[dict[str, Any] | str | None, None]:
    """Chunks of a streamed answer (dicts), ``None`` for a keep-alive, ``"[DONE]"`` last.

    The generation runs on the engine thread and hands events over a queue. If
    the consumer stops early (the client went away), the generation is cancelled
    at its next token and its slot is freed; plugins still hear ``after_generate``.
    """
    loop = asyncio.get_running_loop()
    events: asyncio.Queue = asyncio.Queue()
    finished = object()

    def emit(event: tuple[Any, ...]) -> None:
        loop.call_soon_threadsafe(events.put_nowait, event)

    task = asyncio.ensure_future(host.scheduler.run(GenerationJob(host, ctx, emit), cancel=ctx.cancel_event))

    def on_done(t: asyncio.Future) -> None:
        admission.release()
        events.put_nowait(finished)
        if not t.cancelled():
            t.exception()  # retrieved here; reported below or dropped on a gone client

    task.add_done_callback(on_done)
    ping = host.settings["MILLM_STREAM_PING_S"]
    completed = False
    try:
        choices = len(ctx.prompts) * ctx.n
        if ctx.is_chat:
            yield chunk(ctx, [delta_choice(ctx, i, role=True) for i in range(choices)])
        while True:
            if events.empty():  # wait_for costs a task: only when the next token is not in yet
                try:
                    event = await asyncio.wait_for(events.get(), ping)
                except TimeoutError:
                    yield None  # lets the server notice a client that went away
                    continue
            else:
                event = events.get_nowait()
            if event is finished:
                break
            kind, index, payload = event
            if kind == "delta":
                yield chunk(ctx, [delta_choice(ctx, index, payload)])
            elif kind == "delta_extra":
                yield chunk(ctx, [delta_choice(ctx, index, extra=payload)])
            elif kind == "finish":
                yield chunk(ctx, [delta_choice(ctx, index, None if ctx.is_chat else "", finish_reason=payload)])
        error = task.exception() if not task.cancelled() else None
        if error is not None and not isinstance(error, RequestCancelled):
            yield {"error": raise_for(error).to_dict()}
        else:
            if ctx.params.stream_options and ctx.params.stream_options.include_usage:
                yield chunk(ctx, [], usage=usage(ctx))
            for extra in collect_extras(host, ctx):
                yield chunk(ctx, [], **extra.fields)
        completed = True
        yield DONE
    finally:
        if not completed:
            ctx.interrupted = ctx.interrupted or "client_disconnected"
            ctx.cancel_event.set()


def sse_data(item: dict[str, Any] | str) -> bytes:
    if isinstance(item, str):
        return item.encode()
    return json.dumps(item, separators=(",", ":"), ensure_ascii=False).encode()

