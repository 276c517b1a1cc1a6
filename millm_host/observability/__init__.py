"""What an operator watches: Prometheus metrics, OpenTelemetry traces, structured logs.

``metrics.Metrics`` (``host.metrics``) counts and times; ``tracing.Tracing``
(``host.tracing``) exports spans when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set;
``request.Observation`` is one request's record of both, made by
``Serving.observed``; ``logs`` renders log records as JSON lines with the
request's id and trace id; ``timing.Timing`` holds the instants the engine
thread marks (cheap enough for every token).
"""
