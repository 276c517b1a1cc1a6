"""Typed errors, rendered in OpenAI's error shape.

Every failure a client can see is a ``MillmError``: serving code raises it, one
Falcon error handler renders it as ``{"error": {"message", "type", "param",
"code"}}``. Plugins raise these too (or subclass them) so a refusal from any
plugin looks the same to a client.
"""

from __future__ import annotations

from typing import Any

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class MillmError(Exception):
    """An error with an HTTP status and an OpenAI-shaped body."""

    status: int = 400
    code: str = "invalid_request"
    type: str = INVALID_REQUEST
    #: Seconds a client should wait before retrying: the ``Retry-After`` of every 503.
    retry_after: int = 1

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI error object (the value under ``"error"``)."""
        body = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        body.update(self.extra)
        return body

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.code!r}, {self.message!r})"


class InvalidParameter(MillmError):
    status, code = 400, "invalid_parameter"


class FieldNotHonoured(MillmError):
    status, code = 400, "field_not_honoured"


class UnusedFieldsRefused(MillmError):
    status, code = 400, "unused_fields_refused"


class ContextLengthExceeded(MillmError):
    status, code = 400, "context_length_exceeded"


class ModelNotFound(MillmError):
    status, code, type = 404, "model_not_found", INVALID_REQUEST


class ModelNotLoaded(MillmError):
    status, code, type = 503, "model_not_loaded", SERVER_ERROR


class ModelBusy(MillmError):
    status, code, type = 503, "model_busy", SERVER_ERROR
    retry_after = 5


class ModelUnloaded(MillmError):
    """An operator unloaded the model: a request still running when ``GRACEFUL_UNLOAD_TIMEOUT`` ran out,
    or background work (a batch line) that would load it again (it waits for someone to load it)."""

    status, code, type = 503, "model_unloaded", SERVER_ERROR
    retry_after = 5


class ModelLoadFailed(MillmError):
    status, code, type = 500, "model_load_failed", SERVER_ERROR


class InsufficientMemory(MillmError):
    status, code, type = 503, "insufficient_memory", SERVER_ERROR
    retry_after = 10


class QueueFull(MillmError):
    status, code, type = 503, "queue_full", SERVER_ERROR


class GenerationStalled(MillmError):
    """A generation made no progress for ``MILLM_GENERATION_STALL_S`` (or waited behind one that did)."""

    status, code, type = 503, "generation_stalled", SERVER_ERROR
    retry_after = 10


class ShuttingDown(MillmError):
    """The server is stopping: a new request, or one still running when the shutdown grace ran out."""

    status, code, type = 503, "shutting_down", SERVER_ERROR
    retry_after = 5


class ClientDisconnected(MillmError):
    """The client went away before its answer was ready (nobody reads this response)."""

    status, code = 499, "client_disconnected"


class InternalError(MillmError):
    status, code, type = 500, "internal_error", SERVER_ERROR


class RequestCancelled(Exception):
    """Raised inside the engine thread when a request's client went away."""


def raise_for(exc: BaseException) -> MillmError:
    """A MillmError for any exception (internal errors are not leaked verbatim)."""
    if isinstance(exc, MillmError):
        return exc
    return InternalError(f"internal error: {type(exc).__name__}")
