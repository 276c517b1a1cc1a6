"""Batches: created over an uploaded file, run line by line in the background, resumed after a restart.

``validating`` (every line checked, the lines stored) → ``in_progress`` (pending
lines run through the batch's endpoint, as live requests to its URL are; see
``endpoints``: the host's OpenAI endpoints and those plugins register) →
``finalizing`` (output and error files written) → ``completed``; or ``failed``
(the input file is unusable), ``cancelling`` → ``cancelled``, ``expired`` (past
its completion window; unrun lines go to the error file).

Each line runs as background work (``admission.BACKGROUND``): it is admitted
only while no live request waits or runs, so live traffic is never queued behind
more than the few lines already admitted (``MILLM_BATCH_CONCURRENCY``).

An operator's unload of the batch's model (``POST /api/models/{id}/unload``) is not
undone by the batch: a line cut off by it (``model_unloaded``), and every line after,
stays pending while the batch waits, ``in_progress`` with the reason in its
``errors``, until something loads the model again; then it goes on where it stopped.

Durability: a line's output is stored in the same transaction that marks it
done, exactly once (the update only takes a line still ``pending``). After a
restart every unfinished batch resumes from its pending lines: a finished line
never runs again, and a line that was cut off mid-run (no output stored) runs
again from the start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa

from ..admission import BACKGROUND
from ..errors import ClientDisconnected, InternalError, MillmError, ModelUnloaded, ShuttingDown
from ..paging import page
from . import lease
from .endpoints import BatchEndpoints
from .lines import (
    InputFileInvalid,
    InputLine,
    error_line,
    millm_headers,
    output_line,
    precheck,
    read_lines,
    unrun_line,
)
from .store import FileNotFound, FileStore, new_id
from .tables import Batch, BatchLine, StoredFile

if TYPE_CHECKING:
    from ..adapters import AdapterRegistry
    from ..db import Database
    from ..registry import ModelRegistry
    from ..settings import Settings


class _Replica(Protocol):
    """The replica's convergence, as a batch's lease names its owner."""

    replica_id: str


class BatchHost(Protocol):
    """What the Batch API's runner uses of the host."""

    settings: Settings
    db: Database
    registry: ModelRegistry
    adapters: AdapterRegistry

    @property
    def convergence(self) -> _Replica: ...

    def keep(self, task: asyncio.Task) -> None: ...


log = logging.getLogger("millm.batch")

#: Refusals worth waiting out rather than writing to the error file: the model is loading or unloading.
TRANSIENT = frozenset({"model_busy", "queue_full"})
RETRY_S = 1.0
#: Seconds ``stop`` gives the batch tasks to leave on their own before cancelling them.
STOP_S = 5.0
RETRIES = 60
WINDOW_S = {"24h": 24 * 3600}


class BatchNotFound(MillmError):
    status, code = 404, "batch_not_found"


class BatchNotCancellable(MillmError):
    status, code = 409, "batch_not_cancellable"


def batch_object(row: Batch) -> dict[str, Any]:
    """The row as OpenAI's ``batch`` object."""
    return {
        "id": row.id,
        "object": "batch",
        "endpoint": row.endpoint,
        "model": row.model,
        "errors": {"object": "list", "data": row.errors} if row.errors else None,
        "input_file_id": row.input_file_id,
        "completion_window": row.completion_window,
        "status": row.status,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "created_at": row.created_at,
        "in_progress_at": row.in_progress_at,
        "expires_at": row.expires_at,
        "finalizing_at": row.finalizing_at,
        "completed_at": row.completed_at,
        "failed_at": row.failed_at,
        "expired_at": row.expired_at,
        "cancelling_at": row.cancelling_at,
        "cancelled_at": row.cancelled_at,
        "request_counts": {"total": row.total, "completed": row.completed, "failed": row.failed},
        "metadata": row.metadata_,
    }


class BatchRunner:
    """Every batch of one host: the routes' operations, and a task per batch being worked on."""

    def __init__(self, host: BatchHost, store: FileStore) -> None:
        self.host = host
        self.store = store
        self.db = host.db
        self._tasks: dict[str, asyncio.Task] = {}
        self._cancelled: dict[str, asyncio.Event] = {}
        #: Set when the server stops: lines in flight are cancelled and stay pending.
        self._stopping = asyncio.Event()
        #: This replica's name on the batches it holds the lease of (lease.py).
        self.owner = host.convergence.replica_id
        self.lease_s = max(0.3, float(host.settings["MILLM_BATCH_LEASE_S"]))
        self._sweeper: asyncio.Task | None = None
        #: The URLs a batch may name (``endpoints.collect``, as the routes are installed).
        self.endpoints = BatchEndpoints()

    # --- the routes' operations (event loop; database work on a worker thread) ----------------
    async def create(self, *, input_file_id: str, endpoint: str, window: str, metadata: Any) -> dict[str, Any]:
        row = await asyncio.to_thread(self._insert, input_file_id, endpoint, window, metadata)
        self._start(row.id)
        return batch_object(row)

    def _insert(self, input_file_id: str, endpoint: str, window: str, metadata: Any) -> Batch:
        source = self.store.get(input_file_id, param="input_file_id")
        if source.purpose != "batch":
            raise MillmError(
                f"the file {input_file_id} was uploaded with purpose {source.purpose!r}; a batch needs purpose 'batch'",
                param="input_file_id",
                code="invalid_file_purpose",
            )
        now = int(time.time())
        row = Batch(
            id=new_id("batch_"),
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=window,
            status="validating",
            metadata_=metadata,
            total=0,
            completed=0,
            failed=0,
            created_at=now,
            expires_at=now + WINDOW_S[window],
        )
        with self.db.session() as session, session.begin():
            session.add(row)
        return row

    def get(self, batch_id: str) -> dict[str, Any]:
        return batch_object(self._row(batch_id))

    def _row(self, batch_id: str) -> Batch:
        with self.db.session() as session:
            row = session.get(Batch, batch_id)
        if row is None:
            raise BatchNotFound(f"no batch with id {batch_id!r}", param="batch_id")
        return row

    def list_batches(self, *, after: str | None, limit: int) -> dict[str, Any]:
        """Newest first, as OpenAI lists batches."""
        query = sa.select(Batch).order_by(Batch.created_at.desc(), Batch.id.desc())
        with self.db.session() as session:
            if after:
                cursor = session.get(Batch, after)
                if cursor is None:
                    raise BatchNotFound(f"no batch with id {after!r}", param="after")
                query = query.where(
                    sa.or_(
                        Batch.created_at < cursor.created_at,
                        sa.and_(Batch.created_at == cursor.created_at, Batch.id < cursor.id),
                    )
                )
            rows = list(session.scalars(query.limit(limit + 1)))
        return page([batch_object(r) for r in rows[:limit]], has_more=len(rows) > limit)

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """``cancelling`` now (what has not run goes to the error file), ``cancelled`` once the lines stop."""
        row = await asyncio.to_thread(self._mark_cancelling, batch_id)
        self._cancel_event(batch_id).set()
        if batch_id not in self._tasks:
            self._start(batch_id)
        return batch_object(row)

    def _mark_cancelling(self, batch_id: str) -> Batch:
        with self.db.session() as session, session.begin():
            row = session.get(Batch, batch_id)
            if row is None:
                raise BatchNotFound(f"no batch with id {batch_id!r}", param="batch_id")
            if row.status in ("validating", "in_progress"):
                row.status, row.cancelling_at = "cancelling", int(time.time())
            elif row.status != "cancelling":
                raise BatchNotCancellable(f"the batch is {row.status}; only a batch still running can be cancelled")
        return row

    # --- lifecycle --------------------------------------------------------------------------
    def resume(self) -> None:
        """Resume every unfinished batch no replica holds, now and whenever a lease expires (event loop)."""
        self._sweeper = asyncio.create_task(self._sweep(), name="millm-batch-sweep")
        self.host.keep(self._sweeper)

    async def _sweep(self) -> None:
        """Every half lease: take over the batches whose runner stopped or crashed (its lease expired)."""
        while not self._stopping.is_set():
            try:
                ids = await asyncio.to_thread(lease.claimable, self.db)
            except Exception:  # the database may be away for a moment
                log.exception("looking for batches to resume failed")
                ids = []
            for batch_id in ids:
                if batch_id not in self._tasks:
                    log.info("batch %s: resuming", batch_id)
                    self._start(batch_id)
            try:
                await asyncio.wait_for(self._stopping.wait(), self.lease_s / 2)
            except TimeoutError:
                pass

    async def _renew(self, batch_id: str, runner: asyncio.Task) -> None:
        """Keep the lease while the batch runs; hear of a cancel made on another replica."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            status = await asyncio.to_thread(lease.renew, self.db, batch_id, self.owner, self.lease_s)
            if status is None:  # this replica stalled past its lease and another took the batch
                log.warning("batch %s: its lease went to another replica; stopping here", batch_id)
                runner.cancel()
                return
            if status == "cancelling":
                self._cancel_event(batch_id).set()

    async def stop(self) -> None:
        """Stop every batch task; their unfinished lines stay pending for the next start.

        Lines in flight are cancelled as a client that leaves is (their generation
        stops at the next token), so the engine thread is free for the shutdown.
        """
        self._stopping.set()
        tasks = list(self._tasks.values()) + ([self._sweeper] if self._sweeper is not None else [])
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _cancel_event(self, batch_id: str) -> asyncio.Event:
        return self._cancelled.setdefault(batch_id, asyncio.Event())

    def _start(self, batch_id: str) -> None:
        task = asyncio.create_task(self._run(batch_id), name=f"millm-batch-{batch_id}")
        self._tasks[batch_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(batch_id, None))
        self.host.keep(task)

    async def _run(self, batch_id: str) -> None:
        BACKGROUND.set(True)  # this task's requests (and their tasks) wait for live traffic
        if not await asyncio.to_thread(lease.claim, self.db, batch_id, self.owner, self.lease_s):
            log.info("batch %s: another replica runs it", batch_id)
            self._cancelled.pop(batch_id, None)
            return
        current = asyncio.current_task()
        assert current is not None
        renewing = asyncio.create_task(self._renew(batch_id, current), name=f"millm-batch-lease-{batch_id}")
        try:
            row = await asyncio.to_thread(self._row, batch_id)
            if row.status == "cancelling":
                self._cancel_event(batch_id).set()
            if row.status in ("validating", "in_progress") and row.endpoint not in self.endpoints:
                # stored before a restart without the plugin that served it: nothing here can run its lines
                message = f"no endpoint {row.endpoint} on this server (is the plugin that serves it installed?)"
                row = await asyncio.to_thread(
                    self._fail, batch_id, [{"code": "endpoint_unavailable", "message": message}]
                )
            if row.status == "validating":
                row = await self._validate(row)
            if row.status in ("in_progress", "cancelling"):
                await self._run_lines(row)
            if row.status != "failed":
                await asyncio.to_thread(self._finalize, batch_id)
        except (ShuttingDown, asyncio.CancelledError):
            log.info("batch %s: stopped with the server; it resumes at the next start", batch_id)
        except Exception as exc:
            log.exception("batch %s failed", batch_id)
            await asyncio.to_thread(self._fail, batch_id, [{"code": "internal_error", "message": repr(exc)}])
        finally:
            self._cancelled.pop(batch_id, None)
            renewing.cancel()
            await asyncio.to_thread(lease.release, self.db, batch_id, self.owner)

    # --- validating -------------------------------------------------------------------------
    async def _validate(self, row: Batch) -> Batch:
        settings = self.host.settings
        try:
            raw = await asyncio.to_thread(self.store.read, row.input_file_id)
            lines = await asyncio.to_thread(
                read_lines,
                raw,
                row.endpoint,
                max_lines=settings["MILLM_BATCH_MAX_LINES"],
                max_depth=settings["MILLM_MAX_JSON_DEPTH"],
                max_containers=settings["MILLM_MAX_JSON_CONTAINERS"],
            )
        except FileNotFound as exc:
            return await asyncio.to_thread(self._fail, row.id, [{"code": exc.code, "message": exc.message}])
        except InputFileInvalid as exc:
            return await asyncio.to_thread(self._fail, row.id, [e.to_dict() for e in exc.errors])
        await asyncio.to_thread(precheck, self.endpoints[row.endpoint], lines)
        return await asyncio.to_thread(self._store_lines, row.id, lines)

    def _store_lines(self, batch_id: str, lines: list[InputLine]) -> Batch:
        """Every line in one transaction, with the move to ``in_progress`` (a restart validates again)."""
        model = next((item.body.get("model") for item in lines if item.body is not None), None)
        with self.db.session() as session, session.begin():
            session.execute(sa.delete(BatchLine).where(BatchLine.batch_id == batch_id))
            for item in lines:
                refused = item.error is not None
                session.add(
                    BatchLine(
                        batch_id=batch_id,
                        line=item.line,
                        custom_id=item.custom_id or "",
                        state="failed" if refused else "pending",
                        request=item.body,
                        result=error_line(item.custom_id, item.error) if item.error is not None else None,
                    )
                )
            row = session.get(Batch, batch_id)
            assert row is not None
            row.total = len(lines)
            row.failed = sum(1 for item in lines if item.error is not None)
            row.completed = 0
            row.model = model if isinstance(model, str) else None
            row.in_progress_at = int(time.time())
            if row.status == "validating":
                row.status = "in_progress"
        return row

    def _fail(self, batch_id: str, errors: list[dict[str, Any]]) -> Batch:
        with self.db.session() as session, session.begin():
            row = session.get(Batch, batch_id)
            assert row is not None
            row.status, row.failed_at, row.errors = "failed", int(time.time()), errors
        log.warning("batch %s failed: %s", batch_id, errors[0].get("message"))
        return row

    # --- running ----------------------------------------------------------------------------
    async def _run_lines(self, row: Batch) -> None:
        pending = await asyncio.to_thread(self._pending, row.id)
        cancelled = self._cancel_event(row.id)
        endpoint = self.endpoints[row.endpoint] if row.endpoint in self.endpoints else None  # None: cancelling
        todo: Iterator[tuple[int, str, dict[str, Any]]] = iter(pending)

        stopping = self._stopping

        async def gone() -> None:
            waits = [asyncio.ensure_future(cancelled.wait()), asyncio.ensure_future(stopping.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

        def over() -> bool:
            return cancelled.is_set() or stopping.is_set() or time.time() >= row.expires_at

        async def worker() -> None:
            for line, custom_id, body in todo:  # one shared iterator: each line taken once
                while not over():
                    try:
                        record = await self._run_line(endpoint, custom_id, body, gone)
                    except ModelUnloaded as exc:  # the line stays pending, and runs again once the model is back
                        await self._wait_for_model(row.id, body, exc, over)
                        continue
                    if record is not None:
                        await asyncio.to_thread(self._record, row.id, line, *record)
                    break

        concurrency = max(1, self.host.settings["MILLM_BATCH_CONCURRENCY"])
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        if stopping.is_set():
            raise ShuttingDown("the server is stopping")
        if cancelled.is_set():
            await asyncio.to_thread(self._close_unrun, row.id, "batch_cancelled", "the batch was cancelled first")
        elif time.time() >= row.expires_at:
            await asyncio.to_thread(
                self._close_unrun, row.id, "batch_expired", "the batch's completion window ended first"
            )

    async def _run_line(
        self, endpoint: Any, custom_id: str, body: dict[str, Any], gone: Any
    ) -> tuple[str, dict[str, Any]] | None:
        """``("done"|"failed", output line)``, or None when the line was cut off (batch cancelled, server stopping)."""
        for attempt in range(RETRIES + 1):
            try:
                result = await endpoint.observed(body, {}, gone=gone)  # counted in /metrics like a live request
            except ClientDisconnected:
                return None
            except (ShuttingDown, ModelUnloaded):
                raise
            except MillmError as exc:
                if exc.code in TRANSIENT and attempt < RETRIES:
                    await asyncio.sleep(RETRY_S)
                    continue
                return "failed", error_line(custom_id, exc)
            except Exception as exc:
                log.exception("batch line %s failed", custom_id)
                return "failed", error_line(custom_id, InternalError(f"internal error: {type(exc).__name__}"))
            assert result.body is not None, "batch lines are never streamed"
            line = output_line(
                custom_id,
                status_code=200,
                body=result.body,
                headers=millm_headers(result.headers),
                request_id=result.request_id,
            )
            return "done", line
        raise AssertionError("unreachable")

    async def _wait_for_model(
        self, batch_id: str, body: dict[str, Any], refusal: ModelUnloaded, over: Callable[[], bool]
    ) -> None:
        """An operator unloaded the line's model (the line was cut off, or would have loaded it again): wait
        until something loads it, the batch's ``errors`` saying why meanwhile; or until ``over()``."""
        why = f"waiting: its pending lines run once the model is loaded again ({refusal.message})"
        await asyncio.to_thread(self._set_waiting, batch_id, {"code": refusal.code, "message": why})
        while not over() and self._unloaded(body.get("model")):
            await asyncio.sleep(RETRY_S)
        await asyncio.to_thread(self._set_waiting, batch_id, None)

    def _unloaded(self, name: Any) -> bool:
        """Whether the model ``name`` stands for is one an operator unloaded and nothing loaded since."""
        try:
            return isinstance(name, str) and self.host.adapters.resolve(name)[0].unloaded
        except MillmError:  # gone from the registry: the line's next run says so
            return False

    def _set_waiting(self, batch_id: str, error: dict[str, Any] | None) -> None:
        """Say in the batch's ``errors`` why it waits for its model (None: it no longer does)."""
        with self.db.session() as session, session.begin():
            row = session.get(Batch, batch_id)
            assert row is not None
            waiting = bool(row.errors) and row.errors[0].get("code") == ModelUnloaded.code
            if error is not None and not row.errors:
                row.errors = [error]
            elif error is None and waiting:
                row.errors = None

    def _pending(self, batch_id: str) -> list[tuple[int, str, dict[str, Any]]]:
        with self.db.session() as session:
            rows = session.execute(
                sa.select(BatchLine.line, BatchLine.custom_id, BatchLine.request)
                .where(BatchLine.batch_id == batch_id, BatchLine.state == "pending")
                .order_by(BatchLine.line)
            )
            return [(line, custom_id, request) for line, custom_id, request in rows]

    def _record(self, batch_id: str, line: int, state: str, result: dict[str, Any]) -> None:
        """Store a line's output and count it, once: only a line still pending is taken."""
        with self.db.session() as session, session.begin():
            taken = session.execute(
                sa.update(BatchLine)
                .where(BatchLine.batch_id == batch_id, BatchLine.line == line, BatchLine.state == "pending")
                .values(state=state, result=result, request=None)
            )
            if taken.rowcount == 1:  # type: ignore[attr-defined]
                counter = Batch.completed if state == "done" else Batch.failed
                session.execute(sa.update(Batch).where(Batch.id == batch_id).values({counter: counter + 1}))

    def _close_unrun(self, batch_id: str, code: str, message: str) -> None:
        """Every line still pending goes to the error file with ``code``."""
        with self.db.session() as session, session.begin():
            lines = list(
                session.scalars(
                    sa.select(BatchLine).where(BatchLine.batch_id == batch_id, BatchLine.state == "pending")
                )
            )
            for item in lines:
                item.state, item.request = "failed", None
                item.result = unrun_line(item.custom_id, code, message)
            row = session.get(Batch, batch_id)
            assert row is not None
            row.failed += len(lines)

    # --- finalizing -------------------------------------------------------------------------
    def _finalize(self, batch_id: str) -> None:
        """Write the output and error files and the final status, in one transaction."""
        with self.db.session() as session, session.begin():
            row = session.get(Batch, batch_id)
            assert row is not None
            if row.status == "in_progress":
                row.status, row.finalizing_at = "finalizing", int(time.time())
        with self.db.session() as session:
            lines = list(
                session.execute(
                    sa.select(BatchLine.state, BatchLine.result)
                    .where(BatchLine.batch_id == batch_id, BatchLine.state != "pending")
                    .order_by(BatchLine.line)
                )
            )
        done = [result for state, result in lines if state == "done"]
        failed = [result for state, result in lines if state == "failed"]
        expired = any((result.get("error") or {}).get("code") == "batch_expired" for result in failed)
        files: list[StoredFile] = []
        output_id = error_id = None
        if done:
            files.append(
                self.store.save_bytes(_jsonl(done), filename=f"{batch_id}_output.jsonl", purpose="batch_output")
            )
            output_id = files[-1].id
        if failed:
            files.append(
                self.store.save_bytes(_jsonl(failed), filename=f"{batch_id}_error.jsonl", purpose="batch_output")
            )
            error_id = files[-1].id
        now = int(time.time())
        with self.db.session() as session, session.begin():
            row = session.get(Batch, batch_id)
            assert row is not None
            for stored in files:
                session.add(stored)
            row.output_file_id, row.error_file_id = output_id, error_id
            if row.status == "cancelling":
                row.status, row.cancelled_at = "cancelled", now
            elif expired:
                row.status, row.expired_at = "expired", now
            else:
                row.status, row.completed_at = "completed", now
        log.info("batch %s %s: %d done, %d failed", batch_id, row.status, len(done), len(failed))


def _jsonl(records: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for r in records)
