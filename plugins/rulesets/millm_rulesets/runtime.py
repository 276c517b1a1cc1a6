"""The rulesets plugin's state in one server process: the compiled sets and what is attached where.

Both maps are replaced whole on every change (never mutated), so the engine
thread reads a consistent pair without a lock.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from millm_host.api import MillmError

from . import store
from .code_runner import UNAVAILABLE, CallBudget, CodeResult, CodeRunner, Limits
from .document import RuleSet, Signal, parse
from .evaluate import CodeCall, case_failures
from .rescore import Rescorer

if TYPE_CHECKING:
    from millm_host.api import Host

    from .tables import RuleSetRow

log = logging.getLogger("millm.rulesets")

PUBLISHED = "published"
VECTORS_FAILED = "vectors_failed"


@dataclass(frozen=True)
class Loaded:
    """A stored set as this build reads it: compiled (``rs``), or why it cannot be evaluated."""

    id: str
    ruleset_id: str
    version: str
    digest: str
    status: str
    status_detail: str | None
    rs: RuleSet | None
    created_at: datetime

    @property
    def evaluable(self) -> bool:
        return self.status == PUBLISHED and self.rs is not None


def prove(row: RuleSetRow, code: CodeCall | None = None) -> Loaded:
    """Compile a stored document and run its cases under this build (the startup self-check);
    ``code`` runs operator code the cases name."""
    rs: RuleSet | None = None
    detail: str | None = None
    try:
        rs = parse(json.loads(row.document))
        failures = case_failures(rs, code)
        if failures:
            detail = "cases disagree: " + json.dumps(failures)
    except MillmError as exc:
        detail = f"{exc.code} at {exc.param}: {exc.message}"
    except Exception as exc:  # a document this build cannot even read
        detail = f"{type(exc).__name__}: {exc}"
    status = PUBLISHED if detail is None else VECTORS_FAILED
    return Loaded(row.id, row.ruleset_id, row.version, row.digest, status, detail, rs, row.created_at)


class Runtime:
    """Per-host state of the rulesets plugin."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.sets: dict[str, Loaded] = {}
        self.attached: dict[str, tuple[str, datetime]] = {}  # behaviour -> (rule set id, attached at)
        self._runner: CodeRunner | None = None
        self.rescorer = Rescorer(self)
        #: Held by a change to the stored sets or attachments and by a convergence pass (converge.py), so a
        #: pass never forgets a set this process imports meanwhile.
        self.lock = threading.RLock()

    @property
    def settings(self) -> Any:
        return self.host.settings

    @property
    def runner(self) -> CodeRunner:
        """The rule-runner sidecar (started on first use, restarted when it dies)."""
        if self._runner is None:
            self._runner = CodeRunner(Limits.from_settings(self.settings))
        return self._runner

    def code_caller(self) -> CodeCall:
        """Runs operator code for one stateless request, within its ``CallBudget``."""
        runner = self.runner
        budget = CallBudget(self.settings["RULE_CODE_CALLS_PER_REQUEST"])

        def call(sig: Signal, text: str) -> CodeResult:
            timeout = budget.take(runner.limits.call_timeout_s)
            if timeout is None:
                return CodeResult(None, UNAVAILABLE, "this request's operator-code calls or time are spent")
            source = {"wat": sig.spec["wat"]} if isinstance(sig.spec.get("wat"), str) else {"wasm": sig.spec["wasm"]}
            return runner.count(source, text, timeout)

        return call

    def close(self) -> None:
        self.rescorer.close()
        if self._runner is not None:
            self._runner.close()

    def load(self) -> None:
        """Re-prove every stored set; one this build disagrees with is marked vectors_failed."""
        db = self.host.db
        sets = {}
        for row in store.all_rows(db):
            loaded = prove(row, self.code_caller())
            if loaded.status != row.status or loaded.status_detail != row.status_detail:
                if loaded.status == VECTORS_FAILED:
                    log.warning(
                        "rule set %s (%s v%s) failed its self-check: %s",
                        row.id,
                        row.ruleset_id,
                        row.version,
                        loaded.status_detail,
                    )
                store.set_status(db, row.id, loaded.status, loaded.status_detail)
            sets[row.id] = loaded
        self.sets = sets
        self.attached = store.attachments(db)

    def put(self, loaded: Loaded) -> None:
        self.sets = {**self.sets, loaded.id: loaded}

    def drop(self, rule_set_id: str) -> None:
        self.sets = {k: v for k, v in self.sets.items() if k != rule_set_id}

    def set_attachment(self, behaviour: str, value: tuple[str, datetime] | None) -> None:
        attached = {k: v for k, v in self.attached.items() if k != behaviour}
        if value is not None:
            attached[behaviour] = value
        self.attached = attached

    def attached_to(self, rule_set_id: str) -> list[str]:
        return sorted(k for k, (v, _) in self.attached.items() if v == rule_set_id)
