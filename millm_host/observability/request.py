"""``Observation``: one request as metrics, its trace and its logs see it.

``Serving.observed`` makes one per request and holds it in ``CURRENT`` (a
context variable) while the request runs: the context built for the request
adopts its id and its ``Timing``; log records read the request id and trace id
from it (one request id and one trace id with the request's ``RequestIds``: the
span's trace when tracing is on, else the caller's ``traceparent``, else minted); work handed to the engine and text threads carries it along (the
scheduler runs each call in its submitter's context). When the request is over
(a body written, a stream ended, a refusal raised) ``finish`` records it once.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

from .ids import IDS, RequestIds, new_ids
from .timing import Timing
from .tracing import event_attributes, span_ids

if TYPE_CHECKING:
    from ..context import RequestContext
    from ..settings import Settings
    from .metrics import Metrics
    from .tracing import Tracing


class ObservedHost(Protocol):
    """What a request's observation uses of the host."""

    settings: Settings
    metrics: Metrics
    tracing: Tracing


#: The request being served in this context (None outside one).
CURRENT: ContextVar[Observation | None] = ContextVar("millm_observation", default=None)


def current() -> Observation | None:
    return CURRENT.get()


def current_trace_id() -> str | None:
    """The trace id of the request served in this context (its span's when tracing is on); None outside one."""
    observation = CURRENT.get()
    if observation is not None and observation.trace_id:
        return observation.trace_id
    ids = IDS.get()
    return ids.trace_id if ids is not None else None


class Observation:
    """One request's record: its id, its ``Timing``, its span (when tracing is on)."""

    def __init__(self, host: ObservedHost, endpoint: str, headers: Mapping[str, str]) -> None:
        self.host, self.endpoint = host, endpoint
        self.timing = Timing()
        # the HTTP request's ids (set before routing); a request served outside one (a Batch line) has its own
        request = IDS.get() or new_ids(headers)
        self.request_id = request.request_id
        self.ctx: RequestContext | None = None
        self.ended = False
        tracing = host.tracing
        self.span: Any = tracing.start(endpoint, headers, self.timing.received) if tracing.enabled else None
        ids = span_ids(self.span)
        if ids is not None:  # the span's trace: the caller's when it sent a traceparent, else the span's own
            request.trace_id = ids[0]
        #: The request's trace id in hex (its span's, the caller's, or minted) and its span id (None without
        #: tracing), for the logs and the results.
        self.trace_id: str = request.trace_id
        self.span_id: str | None = ids[1] if ids is not None else None
        self.ids: RequestIds = request

    def attach(self, ctx: RequestContext) -> None:
        """The request's context is built: it takes this request's id and timing."""
        ctx.request_id = self.request_id
        ctx.timing = self.timing
        ctx.observation = self
        self.ctx = ctx

    def event(self, name: str, obj: Mapping[str, Any]) -> None:
        """An event on the request's span (its scalar fields as attributes); nothing without tracing."""
        if self.span is not None:
            self.span.add_event(name, event_attributes(obj))

    def finish(self, status: int) -> None:
        """The request is over with HTTP ``status``: record it (once)."""
        if self.ended:
            return
        self.ended = True
        ended = time.time_ns()
        if self.host.settings["MILLM_METRICS"]:
            self.host.metrics.request_ended(self.endpoint, self.ctx, status, self.timing, ended)
        if self.span is not None:
            self._end_span(status, ended)

    async def follow(self, stream: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
        """``stream``, recorded when it ends (a stream's status is 200: its errors are events in it)."""
        token = CURRENT.set(self)
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()
            self.finish(200)
            try:
                CURRENT.reset(token)
            except ValueError:  # closed from another context than the one it ran in
                pass

    def _end_span(self, status: int, ended: int) -> None:
        from opentelemetry.trace import Status, StatusCode

        span, timing, ctx, tracing = self.span, self.timing, self.ctx, self.host.tracing
        if timing.queued is not None and timing.started is not None:
            tracing.child(span, "queue", timing.queued, timing.started)
        if timing.started is not None and timing.first_token is not None:
            tracing.child(span, "prefill", timing.started, timing.first_token)
        if timing.first_token is not None and timing.last_token is not None:
            tracing.child(
                span, "decode", timing.first_token, timing.last_token, {"gen_ai.usage.output_tokens": _completion(ctx)}
            )
        attributes: dict[str, Any] = {
            "millm.request_id": self.request_id,
            "millm.endpoint": self.endpoint,
            "http.response.status_code": status,
        }
        if ctx is not None:
            attributes["gen_ai.request.model"] = ctx.entry.id if ctx.entry is not None else ""
            attributes["gen_ai.usage.input_tokens"] = sum(len(p) for p in ctx.prompts)
            attributes["gen_ai.usage.output_tokens"] = _completion(ctx)
            attributes["millm.streaming"] = ctx.streaming
            if ctx.interrupted:
                attributes["millm.interrupted"] = ctx.interrupted
        span.set_attributes(attributes)
        if status >= 500:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=ended)


def _completion(ctx: RequestContext | None) -> int:
    return 0 if ctx is None else sum(len(o.token_ids) for o in ctx.outputs)
