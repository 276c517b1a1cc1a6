"""``Tracing`` (``host.tracing``): OpenTelemetry spans over OTLP/HTTP, off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.

Each host has its own ``TracerProvider`` (never the global one), so two hosts in
one process never mix spans, and the SDK is imported only when tracing is on.
Spans go out in batches (``OTEL_BSP_SCHEDULE_DELAY`` and the other standard
variables apply) to ``<endpoint>/v1/traces``; ``OTEL_SERVICE_NAME`` names the
service (default ``millm``). A request's span joins the caller's trace when the
request carries a W3C ``traceparent`` header.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("millm.tracing")


class Tracing:
    """The tracer of one host, or nothing (``enabled`` False) when no OTLP endpoint is set."""

    def __init__(self, endpoint: str | None, service_name: str | None = None) -> None:
        self.enabled = bool(endpoint)
        self.tracer: Any = None
        self._provider: Any = None
        if not endpoint:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name or "millm"}))
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self.tracer = self._provider.get_tracer("millm")
        self._propagator = TraceContextTextMapPropagator()
        log.info("tracing: spans go to %s", traces_url(endpoint))

    def start(self, name: str, headers: Mapping[str, str], start_time: int) -> Any:
        """A request's span, a child of the caller's ``traceparent`` when it sent one."""
        parent = self._propagator.extract(carrier=dict(headers))
        return self.tracer.start_span(name, context=parent, start_time=start_time, kind=_server_kind())

    def child(self, parent: Any, name: str, start: int, end: int, attributes: Mapping[str, Any] | None = None) -> None:
        """A finished child span of ``parent`` from ``start`` to ``end`` (ns)."""
        from opentelemetry import trace

        span = self.tracer.start_span(
            name, context=trace.set_span_in_context(parent), start_time=start, attributes=attributes
        )
        span.end(end_time=end)

    def shutdown(self) -> None:
        """Send what is pending and stop (the host's ``stop``)."""
        if self._provider is not None:
            try:
                self._provider.shutdown()
            except Exception:
                log.exception("flushing spans failed")


def traces_url(endpoint: str) -> str:
    """``OTEL_EXPORTER_OTLP_ENDPOINT`` is a base URL: the traces go to its ``/v1/traces`` (as the spec says)."""
    return endpoint.rstrip("/") + "/v1/traces"


def _server_kind() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.SERVER


def span_ids(span: Any) -> tuple[str, str] | None:
    """``(trace_id, span_id)`` in hex of a recording span, for logs and bodies."""
    if span is None:
        return None
    context = span.get_span_context()
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


def event_attributes(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object's scalar fields as span attributes (``None`` and nested values left out)."""
    return {k: v for k, v in obj.items() if isinstance(v, (str, bool, int, float))}
