"""The refusals this plugin adds to the host's error set (OpenAI's error shape)."""

from __future__ import annotations

from millm_host.api import INVALID_REQUEST, MillmError


class InvalidFeatureIndex(MillmError):
    status, code = 400, "INVALID_FEATURE_INDEX"


class SAENotAttached(MillmError):
    status, code = 400, "SAE_NOT_ATTACHED"


class ProfileNotFound(MillmError):
    status, code, type = 404, "profile_not_found", INVALID_REQUEST


class SAENotFound(MillmError):
    status, code, type = 404, "sae_not_found", INVALID_REQUEST


class ClusterNotFound(MillmError):
    status, code, type = 404, "cluster_not_found", INVALID_REQUEST


class CircuitNotFound(MillmError):
    status, code, type = 404, "circuit_not_found", INVALID_REQUEST


class LabelNotFound(MillmError):
    status, code, type = 404, "label_not_found", INVALID_REQUEST


class Conflict(MillmError):
    """A management change that contradicts stored state (a name taken, an SAE in use)."""

    status, code = 409, "conflict"
