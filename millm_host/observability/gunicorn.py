"""A gunicorn config module for millm: ``gunicorn -c python:millm_host.observability.gunicorn ...``.

- Prometheus multiprocess mode: a worker that exits is marked dead, so its live
  gauges (queue depth, running batch size) leave the sums. Set
  ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory the workers share.
- ``MILLM_LOG_FORMAT=json``: gunicorn's own logs and the app's as JSON lines.
"""

from __future__ import annotations

import os

from .metrics import multiprocess_dir


def child_exit(server, worker) -> None:
    """gunicorn's server hook: a worker ended."""
    if multiprocess_dir():
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)


if os.environ.get("MILLM_LOG_FORMAT") == "json":
    logconfig_dict = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "millm_host.observability.logs.JsonFormatter"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json"}},
        "root": {"level": "INFO", "handlers": ["stderr"]},
        "loggers": {
            "gunicorn.error": {"level": "INFO", "handlers": [], "propagate": True},
            "gunicorn.access": {"level": "INFO", "handlers": [], "propagate": True},
        },
    }
