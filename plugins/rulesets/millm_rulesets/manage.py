"""What the rule-set routes do (blocking: the routes call these in a worker thread)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from millm_host.api import InvalidParameter, MillmError, converge_soon, validate

from . import store
from .code_runner import UNAVAILABLE
from .document import RuleSet, parse
from .errors import CasesFailed, RuleSetNotFound, pointer
from .evaluate import Outcome, Run, Undecided, Vetoed, case_failures, dataset_row, evaluate
from .results import rule_result, undecided_result
from .runtime import PUBLISHED, Loaded, Runtime, prove
from .tables import RuleSetRow


class RuleSetDocument(BaseModel):
    """An ``mi.ruleset/v1`` document (see FORMATS.md); checked in full by the server, not by this schema."""

    model_config = ConfigDict(extra="allow")
    format: str = Field("mi.ruleset/v1", description="Always mi.ruleset/v1")
    ruleset_id: str
    version: str
    signals: dict[str, Any]
    expressions: dict[str, Any] | None = None
    vetoes: list[Any] | None = None
    outputs: list[Any] | None = None
    cases: list[Any] | None = None


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="The text to run every expression and signal on")
    return_rule_positions: bool = Field(False, description="Return the matched spans of this text")


class AttachRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rule_set_id: str = Field(description="The id of an imported rule set (rs_…)")


class RunnerUnavailable(MillmError):
    status, code, type = 503, UNAVAILABLE, "server_error"


def check(runtime: Runtime, document: Any) -> RuleSet:
    """Every check, the cases included (operator code they name runs in the rule runner);
    the compiled set or the first refusal."""
    rs = parse(document)
    failures = case_failures(rs, runtime.code_caller())
    if failures and all(f["got"].get("reason") == UNAVAILABLE for f in failures):
        raise RunnerUnavailable(
            "the rule runner did not answer for the cases that name operator code; nothing was stored, try again",
            extra={"failures": failures},
        )
    if failures:
        first = failures[0]
        what, name = ("outputs", first["output"]) if "output" in first else ("expect", first["name"])
        raise CasesFailed(
            f"{len(failures)} case expectation(s) disagree; first: case {first['case']} expects {what} {name!r} "
            f"{first['expected']}, got {first['got']}",
            param=pointer("cases", first["case"], what, name),
            extra={"failures": failures},
        )
    return rs


def summary(rs: RuleSet) -> dict[str, Any]:
    return {
        "ruleset_id": rs.ruleset_id,
        "version": rs.version,
        "digest": rs.digest,
        "signals": {name: s.kind for name, s in rs.signals.items()},
        "expressions": list(rs.expressions),
        "cases": len(rs.cases),
    }


def validate_document(runtime: Runtime, document: Any) -> dict[str, Any]:
    rs = check(runtime, document)
    return {"object": "rule_set.validation", "valid": True, **summary(rs)}


def describe(runtime: Runtime, loaded: Loaded, with_document: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": loaded.id,
        "object": "rule_set",
        "ruleset_id": loaded.ruleset_id,
        "version": loaded.version,
        "digest": loaded.digest,
        "status": loaded.status,
        "status_detail": loaded.status_detail,
        "signals": {n: s.kind for n, s in loaded.rs.signals.items()} if loaded.rs else None,
        "expressions": list(loaded.rs.expressions) if loaded.rs else None,
        "attached_to": runtime.attached_to(loaded.id),
        "created_at": loaded.created_at.isoformat(),
    }
    if with_document:
        out["document"] = (
            loaded.rs.document if loaded.rs else json.loads(store.get(runtime.host.db, loaded.id).document)
        )
    return out


def import_document(runtime: Runtime, raw: bytes, document: Any) -> dict[str, Any]:
    rs = check(runtime, document)
    stamp = store.now()
    row = RuleSetRow(
        id=store.new_id(),
        ruleset_id=rs.ruleset_id,
        version=rs.version,
        document=raw.decode("utf-8"),
        digest=rs.digest,
        status=PUBLISHED,
        status_detail=None,
        checked_at=stamp,
        created_at=stamp,
    )
    loaded = Loaded(row.id, rs.ruleset_id, rs.version, rs.digest, PUBLISHED, None, rs, stamp)  # check proved it
    with runtime.lock:
        store.insert(runtime.host.db, row)
        runtime.put(loaded)
    converge_soon(runtime.host)
    return describe(runtime, loaded)


def loaded_or_404(runtime: Runtime, rule_set_id: str) -> Loaded:
    loaded = runtime.sets.get(rule_set_id)
    if loaded is None:
        raise RuleSetNotFound(f"no rule set {rule_set_id!r}", param="rule_set_id")
    return loaded


def list_sets(runtime: Runtime) -> dict[str, Any]:
    data = [describe(runtime, s) for s in sorted(runtime.sets.values(), key=lambda s: (s.created_at, s.id))]
    return {"object": "list", "data": data}


def delete(runtime: Runtime, rule_set_id: str) -> dict[str, Any]:
    with runtime.lock:
        store.delete(runtime.host.db, rule_set_id)
        runtime.drop(rule_set_id)
    converge_soon(runtime.host)
    return {"id": rule_set_id, "object": "rule_set", "deleted": True}


def _entry(name: str, outcome: Outcome | Undecided, positions: bool) -> dict[str, Any]:
    if isinstance(outcome, Undecided):
        out: dict[str, Any] = {"name": name, "fires": None, "count": 0, "reason": outcome.reason}
        return {**out, "spans": None} if positions else out
    out = {"name": name, "fires": outcome.fires, "count": outcome.count}
    if positions:  # operator code (and not) has no positions: spans null
        out["spans"] = [{"start": s, "end": e} for s, e in outcome.spans] if outcome.spans is not None else None
    return out


def evaluate_text(runtime: Runtime, rule_set_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """Stateless: every expression (as a rule result) and every signal on the sent text; spans on request."""
    request = validate(EvaluateRequest, body)
    loaded = loaded_or_404(runtime, rule_set_id)
    common = {"object": "rule_set.evaluation", "rule_set_id": loaded.id, "ruleset_id": loaded.ruleset_id}
    if not loaded.evaluable or loaded.rs is None:
        names = list(loaded.rs.expressions) if loaded.rs else []
        results = [
            rule_result(loaded, n, None, None, reason="rule_set_vectors_failed", persistence="not_persisted")
            for n in names
        ]
        return {**common, "results": results, "signals": [], "vetoes": [], "outputs": None}
    rs = loaded.rs
    run = Run(rs, request.text, runtime.code_caller())  # one run: each code rule is called once
    outcomes = evaluate(rs, request.text, run=run)
    results = []
    for name, outcome in outcomes.items():
        assert outcome is not None  # no deadline on the stateless route
        if isinstance(outcome, Undecided):
            result = undecided_result(loaded, name, None, outcome, persistence="not_persisted")
        else:
            result = rule_result(loaded, name, None, outcome, persistence="not_persisted")
        if request.return_rule_positions:
            result["spans"] = _entry(name, outcome, True)["spans"]
        results.append(result)
    signal_outcomes = evaluate(rs, request.text, names=list(rs.signals), run=run)
    signals = [_entry(n, o, request.return_rule_positions) for n, o in signal_outcomes.items() if o is not None]
    return {
        **common,
        "results": results,
        "signals": signals,
        **dataset_view(Vetoed(run), request.return_rule_positions),
    }


def dataset_view(vetoed: Vetoed, positions: bool) -> dict[str, Any]:
    """The set as a dataset reads the sent text: which vetoes fired and what they removed, and the output row.

    ``results`` and ``signals`` stay as served beside probes (vetoes are never applied there). A ``field``
    column is matched text, so like spans it is returned only with ``return_rule_positions`` (else null),
    and only of the sent text."""
    removed = vetoed.removed()
    vetoes = [
        {
            "index": i,
            "when": veto.when,
            "fires": fired,
            "removed": {name: removed.get(name, 0) for name in veto.removes} if fired else {},
        }
        for i, (veto, fired) in enumerate(zip(vetoed.rs.vetoes, vetoed.fired, strict=True))
    ]
    row = dataset_row(vetoed)
    if not positions:
        row = {o.column: None if o.use == "field" else row[o.column] for o in vetoed.rs.outputs}
    return {"vetoes": vetoes, "outputs": row}


def behaviour_view(runtime: Runtime, behaviour: str) -> dict[str, Any]:
    entry = runtime.attached.get(behaviour)
    if entry is None:
        return {
            "object": "behaviour.rule_signals",
            "behaviour": behaviour,
            "rule_set": None,
            "attached_at": None,
            "enabled": runtime.settings["RULE_SIGNALS_ENABLED"],
        }
    loaded = runtime.sets.get(entry[0])
    return {
        "object": "behaviour.rule_signals",
        "behaviour": behaviour,
        "rule_set": describe(runtime, loaded) if loaded else None,
        "attached_at": entry[1].isoformat(),
        "enabled": runtime.settings["RULE_SIGNALS_ENABLED"],
    }


def attach(runtime: Runtime, behaviour: str, body: dict[str, Any]) -> dict[str, Any]:
    request = validate(AttachRequest, body)
    if not behaviour.strip():
        raise InvalidParameter("the behaviour key is empty", param="key")
    if len(behaviour) > 200:  # a behaviour name's limit (probes); the column holds no more
        raise InvalidParameter("the behaviour key is longer than 200 characters", param="key")
    with runtime.lock:
        loaded = runtime.sets.get(request.rule_set_id)
        if loaded is None:  # imported by another process and not converged here yet: read it now
            try:
                loaded = prove(store.get(runtime.host.db, request.rule_set_id), runtime.code_caller())
            except RuleSetNotFound:
                raise RuleSetNotFound(f"no rule set {request.rule_set_id!r}", param="rule_set_id") from None
            runtime.put(loaded)
        stamp = store.attach(runtime.host.db, behaviour, loaded.id)
        runtime.set_attachment(behaviour, (loaded.id, stamp))
    converge_soon(runtime.host)
    return behaviour_view(runtime, behaviour)


def detach(runtime: Runtime, behaviour: str) -> dict[str, Any]:
    with runtime.lock:
        detached = store.detach(runtime.host.db, behaviour)
        runtime.set_attachment(behaviour, None)
    converge_soon(runtime.host)
    if not detached:
        raise MillmError(
            f"behaviour {behaviour!r} has no rule signals attached",
            status=404,
            code="rule_signals_not_attached",
            type="not_found_error",
            param="key",
        )
    return behaviour_view(runtime, behaviour)
