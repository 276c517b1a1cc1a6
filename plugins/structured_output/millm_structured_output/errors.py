"""The errors this plugin answers with, in OpenAI's shape."""

from __future__ import annotations

from millm_host.api import SERVER_ERROR, MillmError


class ResponseFormatUnsupported(MillmError):
    """A ``response_format`` that cannot be honoured (schema keyword, engine, combination)."""

    status, code = 400, "response_format_unsupported"


class ConstrainedOutputInvalid(MillmError):
    """A complete constrained document that fails validation: never a 200."""

    status, code, type = 500, "constrained_output_invalid", SERVER_ERROR
