"""Reading a batch's input file: each line checked as its endpoint would check it, before anything runs.

A line is ``{"custom_id": "...", "method": "POST", "url": "<the batch's endpoint>",
"body": {...}}``. A line that is not that, or whose body its endpoint would refuse
(its ``precheck``: for the host's endpoints protocol, fields, model name, plugins'
``validate_request``; for a plugin's, what its route would refuse),
gets an error line with its ``custom_id`` and an OpenAI-shaped error, and never
runs. Only what makes the whole file unusable (not UTF-8, empty, too many lines,
a ``custom_id`` used twice) fails the batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..bodies.parse import top_level_strings
from ..bodies.read import BodyRefused, parse_json_body
from ..errors import InvalidParameter, MillmError

if TYPE_CHECKING:
    from .endpoints import BatchEndpoint


@dataclass
class InputLine:
    """One line of the input: its number (from 1), ``custom_id``, and the body to run or why not."""

    line: int
    custom_id: str | None
    body: dict[str, Any] | None = None
    error: MillmError | None = None


@dataclass
class FileError:
    """Why the whole input file is unusable (the batch fails): OpenAI's ``BatchError``."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


class InputFileInvalid(Exception):
    def __init__(self, errors: list[FileError]) -> None:
        super().__init__(errors[0].message)
        self.errors = errors


def read_lines(
    raw: bytes, url: str, *, max_lines: int, max_depth: int, max_containers: int | None = None
) -> list[InputLine]:
    """Every non-blank line of ``raw``, parsed and checked for shape (not yet for its endpoint).

    Each line is parsed as a live body is, within ``max_depth`` and ``max_containers``
    (``MILLM_MAX_JSON_CONTAINERS``): a line past them is refused, with its ``custom_id``
    (``top_level_strings``, before or after what was refused), and is never built.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileInvalid([FileError("invalid_file", f"the file is not UTF-8 (byte {exc.start})")]) from None
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not numbered:
        raise InputFileInvalid([FileError("empty_file", "the input file has no lines")])
    if len(numbered) > max_lines:
        raise InputFileInvalid(
            [FileError("too_many_lines", f"the file has {len(numbered)} lines; the limit is {max_lines}")]
        )
    lines = [_read_line(n, line, url, max_depth, max_containers) for n, line in numbered]
    seen: dict[str, int] = {}
    duplicates = []
    for item in lines:
        if item.custom_id is None:
            continue
        if item.custom_id in seen:
            duplicates.append(
                FileError(
                    "duplicate_custom_id",
                    f"custom_id {item.custom_id!r} is used on line {seen[item.custom_id]} and line {item.line}; "
                    "each line's custom_id must be unique",
                    line=item.line,
                    param="custom_id",
                )
            )
        seen.setdefault(item.custom_id, item.line)
    if duplicates:
        raise InputFileInvalid(duplicates)
    return lines


_CUSTOM_ID = frozenset({"custom_id"})


def _read_line(number: int, text: str, url: str, max_depth: int, max_containers: int | None) -> InputLine:
    try:
        record = parse_json_body(text.encode("utf-8"), max_depth, max_containers)
    except MillmError as exc:
        # a line refused for its size still names itself, wherever its custom_id is
        custom_id = top_level_strings(text, _CUSTOM_ID).get("custom_id") if isinstance(exc, BodyRefused) else None
        return InputLine(
            number,
            custom_id or None,
            error=InvalidParameter(f"line {number}: {exc.message.replace('request body', 'line')}"),
        )
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return InputLine(
            number, None, error=InvalidParameter(f"line {number} has no custom_id string", param="custom_id")
        )
    item = InputLine(number, custom_id)
    body = record.get("body")
    if record.get("method") != "POST":
        item.error = InvalidParameter(f"method must be POST, not {record.get('method')!r}", param="method")
    elif record.get("url") != url:
        item.error = InvalidParameter(
            f"url must be this batch's endpoint {url}, not {record.get('url')!r}", param="url"
        )
    elif not isinstance(body, dict):
        item.error = InvalidParameter("body must be a JSON object", param="body")
    elif body.get("stream"):
        item.error = InvalidParameter("a batch line cannot be streamed; leave stream out", param="stream")
    else:
        item.body = body
    return item


def precheck(endpoint: BatchEndpoint, lines: list[InputLine]) -> None:
    """Check each well-formed line's body as its endpoint would, before admission (worker thread)."""
    for item in lines:
        if item.body is None:
            continue
        try:
            endpoint.precheck(item.body, {})
        except MillmError as exc:
            item.error, item.body = exc, None


def error_line(custom_id: str | None, error: MillmError, *, request_id: str | None = None) -> dict[str, Any]:
    """An output line for a request its endpoint refused: the status and OpenAI-shaped error it would have had."""
    return output_line(
        custom_id,
        status_code=error.status,
        body={"error": error.to_dict()},
        headers=millm_headers(error.headers),
        request_id=request_id,
    )


def output_line(
    custom_id: str | None,
    *,
    status_code: int,
    body: dict[str, Any],
    headers: dict[str, str],
    request_id: str | None = None,
) -> dict[str, Any]:
    """OpenAI's batch output line, with every ``X-miLLM-*`` header under ``response.millm.headers``."""
    return {
        "id": f"batch_req_{uuid.uuid4().hex[:24]}",
        "custom_id": custom_id,
        "response": {
            "status_code": status_code,
            "request_id": request_id or uuid.uuid4().hex,
            "body": body,
            "millm": {"headers": headers},
        },
        "error": None,
    }


def unrun_line(custom_id: str, code: str, message: str) -> dict[str, Any]:
    """An error line for a line that never ran (the batch was cancelled or expired first)."""
    return {
        "id": f"batch_req_{uuid.uuid4().hex[:24]}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def millm_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The ``X-miLLM-*`` headers among ``headers`` (names as the server sends them)."""
    return {name: value for name, value in headers.items() if name.lower().startswith("x-millm-")}
