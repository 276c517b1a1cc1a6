"""The Batch API's request and response bodies, as pydantic models (validation and ``/openapi.json``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..protocol import ResponseModel


class FileUpload(BaseModel):
    """``POST /v1/files``: a multipart form."""

    file: bytes = Field(description="The JSONL file (one request per line)", json_schema_extra={"format": "binary"})
    purpose: Literal["batch"] = Field(description="Only batch input files are accepted")


class FileObject(ResponseModel):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: Literal["batch", "batch_output"]
    status: Literal["processed"]
    status_details: str | None


class FileList(ResponseModel):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(ResponseModel):
    id: str
    object: Literal["file"]
    deleted: bool


class CreateBatchRequest(BaseModel):
    """``POST /v1/batches``."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(max_length=40)
    #: Any URL registered as a batch endpoint (``endpoints``): checked by the route, which names them on a 400,
    #: and listed as an enum in ``/openapi.json`` (``Batches.describe_operation``).
    endpoint: str = Field(max_length=200)
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    #: Accepted and not applied: output files are kept until deleted.
    output_expires_after: dict[str, Any] | None = None


class BatchError(ResponseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(ResponseModel):
    object: Literal["list"]
    data: list[BatchError]


class RequestCounts(ResponseModel):
    total: int
    completed: int
    failed: int


class BatchObject(ResponseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: Literal[
        "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
    ]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(ResponseModel):
    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool
