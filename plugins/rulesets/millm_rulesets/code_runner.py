"""The server's side of the rule runner: it starts the sidecar, supervises it and asks it for counts.

Operator code never runs in the server process. ``CodeRunner`` starts
``python -m millm_rulesets.code_worker`` on first use, restarts it when it dies
(noticed by its reader thread, or by the next call), and kills it when a call is
not answered in time (the runner's own wall-time alarm should have answered it).
One call at a time; a call that cannot get the runner in time is
``rule_worker_unavailable``, as is one the runner does not answer.

``CallBudget`` bounds one stateless request: each call waits at most twice
``RULE_CODE_CALL_WALL_MS`` plus a margin, at most ``RULE_CODE_CALLS_PER_REQUEST``
calls, and at most 30 seconds in all.
"""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import IO, Any

log = logging.getLogger("millm.rulesets.runner")

UNAVAILABLE = "rule_worker_unavailable"
CALL_MARGIN_S = 1.0  # per call, beyond twice the wall time: the pipe, the process, compiling the module
REQUEST_TOTAL_S = 30.0  # operator code one request may wait for in all
START_TIMEOUT_S = 30.0  # a runner that has not said it is ready by then is killed
RESTART_BACKOFF_S = 0.5  # between a runner's death and its restart, so a crash loop does not spin
MAX_ANSWER_BYTES = 1 << 16  # an answer line longer than this is not the runner's


@dataclass(frozen=True)
class Limits:
    """What each call may use (passed to the runner as its argument)."""

    fuel: int
    memory_pages: int
    stack_bytes: int
    wall_ms: float
    max_input_bytes: int

    @classmethod
    def from_settings(cls, settings: Any) -> Limits:
        return cls(
            fuel=settings["RULE_CODE_FUEL"],
            memory_pages=settings["RULE_CODE_MEMORY_PAGES"],
            stack_bytes=settings["RULE_CODE_STACK_BYTES"],
            wall_ms=settings["RULE_CODE_CALL_WALL_MS"],
            max_input_bytes=settings["RULE_CODE_MAX_INPUT_BYTES"],
        )

    @property
    def call_timeout_s(self) -> float:
        return 2 * self.wall_ms / 1000.0 + CALL_MARGIN_S


@dataclass(frozen=True)
class CodeResult:
    """A count, or why there is none (a ``rule_*`` code)."""

    count: int | None
    reason: str | None = None
    detail: str | None = None


class CallBudget:
    """One request's share of the runner: a number of calls and a total time."""

    def __init__(self, calls: int, total_s: float = REQUEST_TOTAL_S) -> None:
        self.calls_left = calls
        self.deadline = time.monotonic() + total_s

    def take(self, per_call_s: float) -> float | None:
        """The time the next call may wait, or None when the request's calls or time are spent."""
        left = self.deadline - time.monotonic()
        if self.calls_left <= 0 or left <= 0:
            return None
        self.calls_left -= 1
        return min(per_call_s, left)


class _Process:
    """One runner process and the thread that reads its answers."""

    def __init__(self, limits: Limits, on_exit: Any) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "millm_rulesets.code_worker", json.dumps(asdict(limits))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,  # the runner's own log lines go to the server's stderr
        )
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.started_at = time.monotonic()
        self.ready = threading.Event()  # set when the runner says it has loaded wasmtime
        self.on_exit = on_exit
        threading.Thread(target=self._read, name=f"rule-runner-{self.proc.pid}", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        stdout: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        for line in iter(lambda: stdout.readline(MAX_ANSWER_BYTES), b""):
            try:
                answer = json.loads(line)
            except ValueError:
                answer = None
            if isinstance(answer, dict) and answer.get("ready"):
                self.ready.set()
            elif isinstance(answer, dict):
                self.answers.put(answer)
            else:
                log.warning("rule runner %s wrote a line that is not an answer", self.pid)
        self.proc.wait()
        self.answers.put(None)  # wakes a waiting call: the runner is gone
        self.on_exit(self)

    def send(self, message: dict[str, Any]) -> bool:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def receive(self, rid: int, timeout: float) -> dict[str, Any] | None:
        """The answer to ``rid``; None if the runner died or did not answer in time."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            try:
                answer = self.answers.get(timeout=left)
            except queue.Empty:
                return None
            if answer is None:
                self.answers.put(None)
                return None
            if answer.get("id") == rid:
                return answer
        return None

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("rule runner %s did not exit after SIGKILL", self.pid)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


class CodeRunner:
    """The supervised sidecar that runs operator code (one per server process)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._call = threading.Lock()  # one call at a time
        self._state = threading.Lock()  # guards the process and the counters
        self._process: _Process | None = None
        self._next_id = 0
        self._closed = False
        self.starts = 0

    # --- supervision -------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.alive() else None

    def status(self) -> dict[str, Any]:
        return {
            "object": "rule_runner",
            "running": self.pid is not None,
            "pid": self.pid,
            "starts": self.starts,
            "limits": asdict(self.limits),
        }

    def _start(self, timeout: float) -> _Process | None:
        """A live, ready runner (starting one if needed), or None."""
        with self._state:
            if self._closed:
                return None
            process = self._process
            if process is None or not process.alive():
                if process is not None:
                    process.kill()
                try:
                    process = _Process(self.limits, self._exited)
                except OSError:
                    log.exception("could not start the rule runner")
                    self._process = None
                    return None
                self._process = process
                self.starts += 1
                log.info("rule runner %s %s", process.pid, "restarted" if self.starts > 1 else "started")
        assert process is not None
        if not process.ready.wait(min(timeout, START_TIMEOUT_S)):
            if time.monotonic() - process.started_at >= START_TIMEOUT_S:
                log.error("rule runner %s did not start in time", process.pid)
                self._discard(process)
            return None
        return process

    def _exited(self, process: _Process) -> None:
        """A runner died or was killed (its reader saw EOF): start another unless one already replaced it
        or we are closing."""
        with self._state:
            if self._closed or self._process not in (process, None):
                return
            log.warning("rule runner %s exited with %s; restarting it", process.pid, process.proc.returncode)
        time.sleep(RESTART_BACKOFF_S)
        self._start(START_TIMEOUT_S)

    def _discard(self, process: _Process) -> None:
        with self._state:
            if self._process is process:
                self._process = None
        process.kill()

    def ensure_started(self) -> bool:
        return self._start(START_TIMEOUT_S) is not None

    def close(self) -> None:
        with self._state:
            self._closed = True
            process, self._process = self._process, None
        if process is not None:
            process.kill()

    # --- calls -------------------------------------------------------------------------

    def count(self, source: dict[str, Any], text: str, timeout: float | None = None) -> CodeResult:
        """Run ``source``'s ``count`` on ``text`` in the runner, waiting at most ``timeout`` seconds."""
        if len(text.encode("utf-8")) > self.limits.max_input_bytes:  # never shipped to the runner
            return CodeResult(None, "rule_input_too_large", f"over {self.limits.max_input_bytes} bytes")
        timeout = self.limits.call_timeout_s if timeout is None else timeout
        end = time.monotonic() + timeout
        if not self._call.acquire(timeout=max(0.0, timeout)):
            return CodeResult(None, UNAVAILABLE, "the runner is busy")
        try:
            # A runner that is starting (the first call, or one after a restart) gets its start-up time
            # on top of the call's: counted in the call, a first call on a busy machine found it not
            # ready yet (test_probe_score_waits_for_operator_code failed on CI that way).
            waited_from = time.monotonic()
            process = self._start(START_TIMEOUT_S)
            if process is None:
                return CodeResult(None, UNAVAILABLE, "the runner is not running")
            end += time.monotonic() - waited_from  # the call's own time starts once the runner is ready
            self._next_id += 1
            rid = self._next_id
            if not process.send({"id": rid, "source": source, "text": text}):
                return CodeResult(None, UNAVAILABLE, "the runner went away")
            answer = process.receive(rid, max(0.0, end - time.monotonic()))
            if answer is None:
                if process.alive():  # it did not answer in time: stuck, so replace it
                    log.error("rule runner %s did not answer in %.1f s; killing it", process.pid, timeout)
                    self._discard(process)
                return CodeResult(None, UNAVAILABLE, "the runner did not answer")
        finally:
            self._call.release()
        count = answer.get("count")
        if isinstance(count, int) and not isinstance(count, bool):
            return CodeResult(count)
        return CodeResult(None, str(answer.get("code") or "rule_error"), answer.get("detail"))
