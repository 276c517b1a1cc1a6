"""``OtlpReceiver``: a tiny OTLP/HTTP collector for tests; it keeps every span it is sent.

It decodes ``ExportTraceServiceRequest`` protobuf bodies posted to ``/v1/traces``
(gzip or not) and answers an empty ``ExportTraceServiceResponse``. Point a server
at it with ``OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url``.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def attributes(items: Any) -> dict[str, Any]:
    """OTLP key-values as a dict of plain values."""
    return {kv.key: _value(kv.value) for kv in items}


class OtlpReceiver:
    """``with OtlpReceiver() as receiver: ... receiver.wait_for(lambda spans: ...)``."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    def _add(self, request: Any) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "attributes": attributes(span.attributes),
                            "events": [{"name": e.name, "attributes": attributes(e.attributes)} for e in span.events],
                            "status": span.status.code,
                            "resource": resource,
                        }
                    )
        with self._lock:
            self.spans.extend(spans)

    def wait_for(self, found: Callable[[list[dict[str, Any]]], Any], timeout: float = 30) -> Any:
        """Poll until ``found(spans)`` is truthy; return it (AssertionError with the spans past ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            result = found(spans)
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"the spans never matched; received: {[s['name'] for s in spans]}")
            time.sleep(0.05)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
