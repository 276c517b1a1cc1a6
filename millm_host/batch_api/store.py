"""Files for the Batch API: bytes in ``<data dir>/files/<id>``, a row each in ``batch_files``.

A file on disk is named by its id, never by the name the client sent (that is
only echoed back as ``filename``), so no upload can choose where it lands. Bytes
are written to a temporary file beside the target, flushed to disk and renamed
into place: a reader, or a restart after a crash, never sees half a file.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import unicodedata
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from ..db import Database
from ..errors import MillmError
from ..paging import page
from .tables import StoredFile

#: Bytes read from disk at a time when a file's content is sent.
CHUNK = 256 * 1024


class FileNotFound(MillmError):
    status, code = 404, "file_not_found"


class FileTooLarge(MillmError):
    status, code = 413, "file_too_large"


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def shown_filename(raw: str | None) -> str:
    """The client's file name, reduced to a last path component without control characters (255 bytes)."""
    name = (raw or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip()
    name = name.encode("utf-8")[:255].decode("utf-8", "ignore")
    return name or "upload.jsonl"


def file_object(row: StoredFile) -> dict[str, Any]:
    """The row as OpenAI's ``file`` object."""
    return {
        "id": row.id,
        "object": "file",
        "bytes": row.bytes,
        "created_at": row.created_at,
        "expires_at": None,
        "filename": row.filename,
        "purpose": row.purpose,
        "status": "processed",
        "status_details": None,
    }


class FileStore:
    """The files directory and its table."""

    def __init__(self, root: Path, db: Database) -> None:
        self.root = root
        self.db = db

    def path(self, file_id: str) -> Path:
        return self.root / file_id  # ids are made here (new_id) and looked up in the table first

    # --- writing ------------------------------------------------------------------------
    async def save_stream(self, chunks: AsyncIterable[bytes], *, limit: int) -> tuple[str, int]:
        """Store an upload as it arrives: its new id and size (no row yet: ``insert``, or ``discard``).

        ``413 file_too_large``, nothing kept, once past ``limit`` bytes.
        """
        file_id = new_id("file-")
        temp = await asyncio.to_thread(self._temp)
        size = 0
        try:
            with temp:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > limit:
                        raise FileTooLarge(f"the file is over the {limit}-byte limit (MILLM_FILES_MAX_BYTES)")
                    await asyncio.to_thread(temp.write, chunk)
                await asyncio.to_thread(_sync, temp)
            await asyncio.to_thread(os.replace, temp.name, self.path(file_id))
        except BaseException:
            await asyncio.to_thread(_unlink, Path(temp.name))
            raise
        return file_id, size

    def insert(self, file_id: str, filename: str, purpose: str, size: int) -> dict[str, Any]:
        """The row of a file ``save_stream`` stored: from now on it is listed."""
        row = StoredFile(id=file_id, filename=filename, purpose=purpose, bytes=size, created_at=int(time.time()))
        with self.db.session() as session, session.begin():
            session.add(row)
        return file_object(row)

    def discard(self, file_id: str) -> None:
        """Remove a file ``save_stream`` stored that will not be kept."""
        _unlink(self.path(file_id))

    def save_bytes(self, data: bytes, *, filename: str, purpose: str) -> StoredFile:
        """Write ``data`` as a new file (a batch's output); the caller adds the returned row in its transaction."""
        file_id = new_id("file-")
        with self._temp() as temp:
            temp.write(data)
            _sync(temp)
        os.replace(temp.name, self.path(file_id))
        return StoredFile(id=file_id, filename=filename, purpose=purpose, bytes=len(data), created_at=int(time.time()))

    def _temp(self) -> Any:
        self.root.mkdir(parents=True, exist_ok=True)
        return tempfile.NamedTemporaryFile(dir=self.root, prefix=".upload-", delete=False)

    # --- reading ------------------------------------------------------------------------
    def get(self, file_id: str, param: str = "file_id") -> StoredFile:
        with self.db.session() as session:
            row = session.get(StoredFile, file_id)
        if row is None:
            raise FileNotFound(f"no file with id {file_id!r}", param=param)
        return row

    def read(self, file_id: str) -> bytes:
        self.get(file_id)
        return self.path(file_id).read_bytes()

    async def chunks(self, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes, read off the event loop a chunk at a time."""
        handle = await asyncio.to_thread(open, self.path(file_id), "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, CHUNK):
                yield chunk
        finally:
            handle.close()

    def list_files(self, *, purpose: str | None, limit: int, order: str, after: str | None) -> dict[str, Any]:
        """OpenAI's list object, newest first by default; ``after`` is the id the last page ended with."""
        descending = order == "desc"
        key = (
            (StoredFile.created_at.desc(), StoredFile.id.desc())
            if descending
            else (StoredFile.created_at, StoredFile.id)
        )
        query = sa.select(StoredFile).order_by(*key)
        if purpose:
            query = query.where(StoredFile.purpose == purpose)
        with self.db.session() as session:
            if after:
                cursor = session.get(StoredFile, after)
                if cursor is None:
                    raise FileNotFound(f"no file with id {after!r}", param="after")
                query = query.where(_after(StoredFile, cursor, descending))
            rows = list(session.scalars(query.limit(limit + 1)))
        return page([file_object(r) for r in rows[:limit]], has_more=len(rows) > limit)

    # --- deleting -----------------------------------------------------------------------
    def delete(self, file_id: str) -> dict[str, Any]:
        with self.db.session() as session, session.begin():
            row = session.get(StoredFile, file_id)
            if row is None:
                raise FileNotFound(f"no file with id {file_id!r}", param="file_id")
            session.delete(row)
        _unlink(self.path(file_id))
        return {"id": file_id, "object": "file", "deleted": True}


def _after(table: Any, cursor: Any, descending: bool) -> Any:
    """Rows past ``cursor`` in (created_at, id) order."""
    if descending:
        return sa.or_(
            table.created_at < cursor.created_at, sa.and_(table.created_at == cursor.created_at, table.id < cursor.id)
        )
    return sa.or_(
        table.created_at > cursor.created_at, sa.and_(table.created_at == cursor.created_at, table.id > cursor.id)
    )


def _sync(handle: Any) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
