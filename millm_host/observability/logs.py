"""Structured logs (``MILLM_LOG_FORMAT=json``): one JSON object a line, with the request's id and trace id.

A record logged while a request is served (on the event loop, or on the engine
or text thread working for it) carries ``request_id`` and, when the request
joined a trace (``traceparent``, or a span of its own), ``trace_id`` and
``span_id``. ``millm serve`` installs the formatter; under gunicorn use the
config module ``millm_host.observability.gunicorn``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from .request import CURRENT


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message", "request_id", "trace_id", "span_id", "exception"}``."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        observation = CURRENT.get()
        if observation is not None:
            line["request_id"] = observation.request_id
            if observation.trace_id:
                line["trace_id"] = observation.trace_id
            if observation.span_id:
                line["span_id"] = observation.span_id
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def use_json(level: int = logging.INFO) -> None:
    """Every record of the process as JSON lines on stderr (the root logger's handlers)."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler())
    for handler in root.handlers:
        handler.setFormatter(JsonFormatter())
    root.setLevel(level)
