"""The routes: ``/v1/files`` and ``/v1/batches``, as OpenAI serves them."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import falcon
import falcon.asgi
from pydantic import Field, create_model

from ..bodies.validate import validate
from ..errors import InvalidParameter, MillmError
from ..openapi import Operation, Param, operation
from ..resources.common import JsonResource
from .endpoints import collect
from .schemas import BatchList, BatchObject, CreateBatchRequest, FileDeleted, FileList, FileObject, FileUpload
from .store import FileTooLarge, shown_filename

if TYPE_CHECKING:
    from .runner import BatchRunner
    from .store import FileStore

#: Room for a multipart form's boundaries and part headers around the file itself.
FORM_OVERHEAD = 64 * 1024
ENDPOINT_DESCRIPTION = "The URL every line names: the host's OpenAI endpoints and those its plugins register"
LIMIT = Param("limit", {"type": "integer", "minimum": 1, "maximum": 10000}, "How many to list")
AFTER = Param("after", description="The id the previous page ended with")


def _disposition(part: Any) -> tuple[str | None, str | None]:
    """A form part's name and file name; a 400 when its ``Content-Disposition`` is not UTF-8
    (falcon decodes the header as UTF-8 when either is first read, and raised a 500)."""
    try:
        return part.name, part.filename
    except UnicodeDecodeError as exc:
        raise InvalidParameter(
            f"a form part's Content-Disposition is not UTF-8 (byte {exc.start}); send the file name as UTF-8",
            param="file",
        ) from None


class Files(JsonResource):
    """``/v1/files``: upload (multipart, ``purpose=batch``) and list."""

    def __init__(self, host, store: FileStore) -> None:
        super().__init__(host)
        self.store = store

    @operation("Upload a JSONL file for a batch (multipart: file, purpose=batch)", form=FileUpload, response=FileObject)
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        limit = self.host.settings["MILLM_FILES_MAX_BYTES"]
        if req.content_length is not None and req.content_length > limit + FORM_OVERHEAD:
            raise FileTooLarge(f"the upload is {req.content_length} bytes; files are limited to {limit} bytes")
        if (req.content_type or "").split(";")[0].strip().lower() != falcon.MEDIA_MULTIPART:
            raise MillmError(
                "upload a file as multipart/form-data with the fields file and purpose",
                status=415,
                code="unsupported_media_type",
                param="Content-Type",
            )
        form = await req.get_media()
        purpose: str | None = None
        saved: tuple[str, str, int] | None = None
        try:
            async for part in form:
                name, raw_filename = _disposition(part)
                if name == "file" and saved is None:
                    filename = shown_filename(raw_filename)
                    file_id, size = await self.store.save_stream(part.stream, limit=limit)
                    saved = (file_id, filename, size)
                elif name == "purpose":
                    purpose = (await part.get_data()).decode("utf-8", "replace").strip()
            if saved is None:
                raise InvalidParameter("the form has no file part", param="file")
            if purpose != "batch":
                raise InvalidParameter(f"purpose must be 'batch', not {purpose!r}", param="purpose")
        except BaseException:
            if saved is not None:
                await asyncio.to_thread(self.store.discard, saved[0])
            raise
        file_id, filename, size = saved
        resp.media = await asyncio.to_thread(self.store.insert, file_id, filename, purpose, size)

    @operation(
        "The uploaded files, newest first",
        response=FileList,
        query=[
            Param("purpose", description="Only files with this purpose"),
            LIMIT,
            Param("order", {"type": "string", "enum": ["asc", "desc"]}, "By creation time"),
            AFTER,
        ],
        errors=(404,),  # an ``after`` cursor naming no file
    )
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        order = req.get_param("order") or "desc"
        if order not in ("asc", "desc"):
            raise InvalidParameter("order must be asc or desc", param="order")
        resp.media = await asyncio.to_thread(
            self.store.list_files,
            purpose=req.get_param("purpose"),
            limit=req.get_param_as_int("limit", min_value=1, max_value=10000) or 10000,
            order=order,
            after=req.get_param("after"),
        )


class File(JsonResource):
    """``/v1/files/{file_id}`` and its ``/content``."""

    def __init__(self, host, store: FileStore) -> None:
        super().__init__(host)
        self.store = store

    @operation("A file", response=FileObject, errors=(404,))
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, file_id: str) -> None:
        from .store import file_object

        resp.media = file_object(await asyncio.to_thread(self.store.get, file_id))

    @operation("Delete a file", response=FileDeleted, errors=(404,))
    async def on_delete(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, file_id: str) -> None:
        resp.media = await asyncio.to_thread(self.store.delete, file_id)

    # OpenAI's document calls this application/json (a string); the bytes are JSONL, which a client that
    # honours the type could not parse as one JSON document, so they are served, and documented, as bytes.
    @operation("A file's bytes, as uploaded or written", errors=(404,), media_type="application/octet-stream")
    async def on_get_content(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, file_id: str) -> None:
        row = await asyncio.to_thread(self.store.get, file_id)
        resp.content_type = "application/octet-stream"
        resp.content_length = row.bytes
        resp.stream = self.store.chunks(file_id)


class Batches(JsonResource):
    """``/v1/batches``: create and list."""

    def __init__(self, host, runner: BatchRunner) -> None:
        super().__init__(host)
        self.runner = runner

    def describe_operation(self, method: str, suffix: str | None) -> Operation | None:
        """``POST``: the request as this server takes it, ``endpoint`` an enum of the URLs registered here
        (plugins add theirs), which the static ``CreateBatchRequest`` cannot list."""
        if method != "POST" or suffix is not None:
            return None
        described: Operation = self.on_post.__openapi__  # type: ignore[attr-defined]
        request = create_model(
            "CreateBatchRequest",
            __base__=CreateBatchRequest,
            __doc__=CreateBatchRequest.__doc__,
            endpoint=(Literal[tuple(self.runner.endpoints)], Field(description=ENDPOINT_DESCRIPTION)),  # type: ignore[arg-type]
        )
        return replace(described, request=(request,))

    @operation(
        "Create a batch over an uploaded JSONL file", request=CreateBatchRequest, response=BatchObject, errors=(404,)
    )
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        params = validate(CreateBatchRequest, await self.json(req))
        self.runner.endpoints.check(params.endpoint)
        resp.media = await self.runner.create(
            input_file_id=params.input_file_id,
            endpoint=params.endpoint,
            window=params.completion_window,
            metadata=params.metadata,
        )

    @operation("The batches, newest first", response=BatchList, query=[AFTER, LIMIT], errors=(404,))
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        limit = req.get_param_as_int("limit", min_value=1, max_value=10000) or 20
        resp.media = await asyncio.to_thread(self.runner.list_batches, after=req.get_param("after"), limit=limit)


class OneBatch(JsonResource):
    """``/v1/batches/{batch_id}`` and its ``/cancel``."""

    def __init__(self, host, runner: BatchRunner) -> None:
        super().__init__(host)
        self.runner = runner

    @operation("A batch", response=BatchObject, errors=(404,))
    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, batch_id: str) -> None:
        resp.media = await asyncio.to_thread(self.runner.get, batch_id)

    @operation("Cancel a running batch", request=None, response=BatchObject, errors=(404, 409))
    async def on_post_cancel(self, req: falcon.asgi.Request, resp: falcon.asgi.Response, batch_id: str) -> None:
        resp.media = await self.runner.cancel(batch_id)


def install(host, add_route) -> None:
    """Add the routes (``routes.install``)."""
    runner = host.batches
    runner.endpoints = collect(host)  # the host's and the plugins' (hook register_batch_endpoints)
    files, batches = File(host, runner.store), OneBatch(host, runner)
    add_route("/v1/files", Files(host, runner.store))
    add_route("/v1/files/{file_id}", files)
    add_route("/v1/files/{file_id}/content", files, suffix="content")
    add_route("/v1/batches", Batches(host, runner))
    add_route("/v1/batches/{batch_id}", batches)
    add_route("/v1/batches/{batch_id}/cancel", batches, suffix="cancel")
