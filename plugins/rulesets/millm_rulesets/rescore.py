"""After the response: operator code of live requests scored by the rule runner, results revised in place.

A live request never waits for operator code (D41): its code-rule results report
``skipped`` / ``rule_worker_unavailable``. ``Rescorer`` takes those results with
their window's text onto one background thread, asks the runner (each request
within its own ``CallBudget``) and replaces each stored result by its
``result_id`` (hook ``revise_monitor_results``) with the count, or the runner's
failure code. A result the runner does not answer for stays
``rule_worker_unavailable``. The queue is bounded: when it is full, new work is
dropped (logged) and those results stay as they were stored.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from millm_host.api import revise_monitor_results

from .evaluate import Outcome, Run, Undecided
from .results import now_iso

if TYPE_CHECKING:
    from .runtime import Loaded, Runtime

log = logging.getLogger("millm.rulesets")

QUEUE_SIZE = 1000  # windows waiting for the runner
STORE_WAIT_S = 5.0  # how long a revision waits for the probes plugin to have stored the result


@dataclass(frozen=True)
class Job:
    loaded: Loaded
    text: str
    results: list[dict[str, Any]]  # the pending results of one window (never mutated: copies are revised)


def revised(result: dict[str, Any], got: Outcome | Undecided) -> dict[str, Any]:
    out = {**result, "revised_at": now_iso()}
    if isinstance(got, Undecided):
        out.update(outcome="failed", reason=got.reason, status="unavailable", fires=None, count=0)
    else:
        out.update(outcome="completed", reason=None, status="final", fires=got.fires, count=got.count)
    return out


class Rescorer:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.revised = 0  # results replaced so far (tests and logs)

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="rule-rescorer", daemon=True)
                self._thread.start()
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            log.warning("operator-code queue full: %d results stay rule_worker_unavailable", len(job.results))

    def close(self) -> None:
        if self._thread is not None:
            try:
                self.jobs.put_nowait(None)
            except queue.Full:
                pass

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                self._run(job)
            except Exception:
                log.exception("scoring operator code after the response failed")

    def _run(self, job: Job) -> None:
        assert job.loaded.rs is not None
        run = Run(job.loaded.rs, job.text, self.runtime.code_caller())
        changes = []
        for result in job.results:
            got = run.get(result["name"])
            if isinstance(got, Undecided) and got.skipped:
                continue  # no runner answer: it stays rule_worker_unavailable
            changes.append(revised(result, got))
        if not changes:
            return
        deadline = time.monotonic() + STORE_WAIT_S
        while True:  # the probes plugin stores a request's results right after collecting them
            if revise_monitor_results(self.runtime.host, changes) >= len(changes) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        self.revised += len(changes)
