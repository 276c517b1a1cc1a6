"""After SIGTERM, until the listener closes: a new request is answered ``503 shutting_down``.

``millm serve`` keeps listening while the admitted requests finish (``MILLM_SHUTDOWN_GRACE_S``,
see ``cli.Server``), so a client that connects meanwhile is told, in OpenAI's error shape and
with ``Retry-After``, to go elsewhere, rather than refused at TCP. The health routes and
``/metrics`` still answer: they are how a load balancer and a scraper see the drain
(``/api/health/ready`` says 503 ``not_ready``, ``/api/health`` ``queue.shutting_down``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import ShuttingDown

if TYPE_CHECKING:
    from .scheduler import Scheduler

#: Paths still served while the server drains (a prefix, or the path itself).
STILL_ANSWERED = ("/api/health", "/health", "/ping", "/metrics")


class Draining:
    """Falcon middleware: once the host's shutdown began, every other request is refused."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    async def process_request(self, req, resp) -> None:
        if self.scheduler.closing and not req.path.startswith(STILL_ANSWERED):
            raise ShuttingDown("the server is shutting down; retry on another instance or once it is back")
