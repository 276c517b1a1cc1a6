"""The refusals of the probe API, in OpenAI's error shape (codes as the spec names them)."""

from __future__ import annotations

from typing import Any

from millm_host.api import MillmError


class InvalidDefinition(MillmError):
    status, code = 400, "invalid_probe_definition"


class ProbeNotFound(MillmError):
    status, code, type = 404, "probe_not_found", "not_found_error"


class ResultNotFound(MillmError):
    status, code, type = 404, "result_not_found", "not_found_error"


class NameConflict(MillmError):
    status, code = 409, "PROBE_NAME_CONFLICT"


class IdentityMismatch(MillmError):
    """A digest carried by a document differs from the one recomputed here."""

    status, code = 409, "PROBE_IDENTITY_MISMATCH"


class IdentityAlgorithmUnknown(MillmError):
    status, code = 409, "PROBE_IDENTITY_ALGORITHM_UNKNOWN"


class ProbeArmed(MillmError):
    status, code = 409, "PROBE_ARMED"


class ProvenanceMismatch(MillmError):
    status, code = 409, "PROBE_PROVENANCE_MISMATCH"


class ModelChanged(MillmError):
    status, code = 409, "MODEL_CHANGED"


class GateRefused(MillmError):
    """An arming gate refused; ``gate`` names it, because each calls for a different action."""

    status = 409

    def __init__(self, gate: str, code: str, message: str, **extra: Any) -> None:
        super().__init__(f"gate {gate}: {message}", code=code, extra={"gate": gate, **extra})
        self.gate = gate


def mismatch_message(mismatches: list[dict[str, Any]]) -> str:
    """``field (probe X, model Y); ...`` for every mismatched identity field."""
    return "; ".join(f"{m['field']} (probe {m['probe']!r}, model {m['model']!r})" for m in mismatches)
