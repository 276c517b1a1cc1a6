"""``/api/probes/score`` as a Batch API endpoint (hook ``register_batch_endpoints``).

A batch over ``/api/probes/score`` scores a file of requests offline, at batch
priority: each line's body is a ``POST /api/probes/score`` body, and its output
line's body is what that route returns (results valid against
``mi.probe.result/v1``, never stored). A line the route would refuse for its shape
or its limits becomes an error line before anything runs; one refused later (an
unknown probe, a model mismatch) gets its error line with the route's status.
"""

from __future__ import annotations

from typing import Any

from millm_host.api import BatchResult

from ..runtime import Runtime
from . import stateless

URL = "/api/probes/score"


class ScoreLines:
    """What the Batch API calls for each line of a batch over ``URL``."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def precheck(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Refuse what the route refuses before looking at a probe or the model (worker thread)."""
        stateless.check(self.runtime, body)

    async def observed(self, body: dict[str, Any], headers: dict[str, str], *, gone: Any = None) -> BatchResult:
        """The route's answer. ``gone`` is not watched: a line is at most PROBE_SCORE_MAX_INPUTS forward
        passes, so a cancelled batch lets the line in flight finish (the server's stop still cuts it off)."""
        answer = await stateless.score(self.runtime, body, headers)
        return BatchResult(body=answer, request_id=answer["request_id"])
