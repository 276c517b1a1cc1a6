"""The refusals of the probe API, in OpenAI's error shape (codes as the spec names them)."""

from __future__ import annotations

from typing import Any

from millm_host.api import SERVER_ERROR, MillmError


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


class ParityStopped(MillmError):
    """Parity stopped before its last vector: the model began to unload (or changed) while it ran."""

    status, code = 409, "PROBE_PARITY_STOPPED"


class GateRefused(MillmError):
    """An arming gate refused; ``gate`` names it, because each calls for a different action."""

    status = 409

    def __init__(self, gate: str, code: str, message: str, **extra: Any) -> None:
        super().__init__(f"gate {gate}: {message}", code=code, extra={"gate": gate, **extra})
        self.gate = gate


def mismatch_message(mismatches: list[dict[str, Any]]) -> str:
    """``field (probe X, model Y); ...`` for every mismatched identity field."""
    return "; ".join(f"{m['field']} (probe {m['probe']!r}, model {m['model']!r})" for m in mismatches)


# --- Browse Hub (hub/): the Hub is an upstream, so its failures are gateway errors ----------
class HubNotFound(MillmError):
    status, code, type = 404, "hub_not_found", "not_found_error"


class HubUnavailable(MillmError):
    """The Hub could not be reached, failed, or answered something not shaped like the Hub API."""

    status, code, type = 502, "hub_unavailable", SERVER_ERROR


class HubResponseTooLarge(MillmError):
    status, code, type = 502, "hub_response_too_large", SERVER_ERROR


class HubTimeout(MillmError):
    status, code, type = 504, "hub_timeout", SERVER_ERROR


class HubNotConfigured(MillmError):
    status, code, type = 503, "hub_not_configured", SERVER_ERROR


class HubBusy(MillmError):
    status, code, type = 503, "hub_busy", SERVER_ERROR
