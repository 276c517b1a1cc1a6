"""Structured logs (``MILLM_LOG_FORMAT=json``): one JSON object a line, with the request's id and trace id.

A record logged while a request is served (on the event loop, or on the engine
or text thread working for it, and uvicorn's access line) carries ``request_id``
and ``trace_id`` (the trace its probe results name), and ``span_id`` when
tracing is on. ``millm serve`` installs the formatter; under gunicorn use the
config module ``millm_host.observability.gunicorn``.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from .ids import IDS
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
        ids = observation.ids if observation is not None else IDS.get()
        if ids is not None:  # while a request is served, or after its Observation ended (the access line)
            line["request_id"] = ids.request_id
            line["trace_id"] = ids.trace_id
        if observation is not None and observation.span_id:
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
