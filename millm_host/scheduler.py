"""The bounded request queue, the engine thread and the text thread.

One engine thread runs all model work (loads, generation, scoring) in order, so
a model is never touched by two threads. Requests reserve a place before doing
any work; when ``MILLM_QUEUE_MAX`` requests already wait for the slot the next
one is refused with ``503 queue_full``.

A second thread, the text thread, renders and tokenizes prompts for engines
whose text methods may run beside a generation (``Engine.concurrent_text``), so
a refusal that needs only the tokenizer never waits behind the engine thread.

Both are daemon threads: a generation stuck in native code cannot keep the
process from exiting. A generation reports progress (``beat``) at every token;
one that makes none for ``MILLM_GENERATION_STALL_S`` is stalled, and whatever
waits behind it is failed rather than left waiting.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, Future
from typing import Any, TypeVar

from .cancellation import when_set
from .errors import GenerationStalled, MillmError, QueueFull, RequestCancelled, ShuttingDown
from .threadcache import ThreadCache

T = TypeVar("T")

#: How often a waiter looks for a stall or the end of the shutdown grace (seconds).
TICK = 0.25


class Ticket:
    """A reserved place in the queue; released exactly once."""

    def __init__(self, scheduler: Scheduler, background: bool = False) -> None:
        self._scheduler = scheduler
        self._released = False
        self.background = background

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._scheduler._release(self.background)

    def __enter__(self) -> Ticket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


#: Set (``BACKGROUND.set(True)``) in a task whose requests are background work: the Batch API's
#: runner. Its admissions wait while any live request is admitted (``Scheduler.reserve_background``),
#: and its calls on the engine and text threads run after every live call queued (``Worker``).
BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("millm_background", default=False)

#: Worker priorities: live calls first, then background calls, each in order; ``stop`` after all.
LIVE, LOW, LAST = 0, 1, 2


class Worker:
    """One daemon thread running submitted calls in order, live calls before background ones.

    A batch line admitted before a live request arrived may already be queued here;
    the live call still runs first, so it waits only for the call that is running.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()  # ties broken by submission: FIFO within a priority
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self.ident = self._thread.ident

    def submit(self, fn: Callable[..., T], *args: Any, priority: int | None = None) -> Future[T]:
        """Queue ``fn(*args)``; the priority is the submitter's (``BACKGROUND``) unless given."""
        future: Future[T] = Future()
        if priority is None:
            priority = LOW if BACKGROUND.get() else LIVE
        # in the submitter's context: the request's log context and observation go along
        self._jobs.put((priority, next(self._order), (future, contextvars.copy_context().run, (fn, *args))))
        return future

    def _loop(self) -> None:
        while True:
            _, _, item = self._jobs.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            try:
                result = fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, fn, args, item  # drop references before waiting again

    def stop(self) -> None:
        """Stop after the calls already submitted (returns at once)."""
        self._jobs.put((LAST, next(self._order), None))

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


class Scheduler:
    """Admission control, the engine thread and the text thread."""

    def __init__(self, queue_max: int, stall_s: float = 0.0) -> None:
        self.queue_max = queue_max
        #: Seconds without progress after which a running generation is stalled (0: never).
        self.stall_s = stall_s
        self._engine = Worker("millm-engine")
        self._text = Worker("millm-text")
        self._lock = threading.Lock()
        self._admitted = 0  # waiting + running
        #: Told ``(admitted, running)`` whenever either changes (the queue metrics).
        self.watch: Callable[[int, int], None] | None = None
        self._background = 0  # of which background work (batch lines)
        self._beat: float | None = None  # last progress of the running generations; None while none runs
        #: Generations running on threads of their own (``submit_beside``): a drain waits for them too.
        self._beside: set[Future] = set()
        self._generation_threads = ThreadCache("millm-generation")
        self._generations = 0  # running (several at once when the engine batches)
        #: Set when shutdown begins: new requests are refused (``503 shutting_down``).
        self.closing = False
        #: When the shutdown grace ends (``time.monotonic()``): what still waits is cancelled.
        self.deadline: float | None = None

    @property
    def engine_thread_id(self) -> int | None:
        return self._engine.ident

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def live(self) -> int:
        """Admitted requests that are not background work."""
        return self._admitted - self._background

    def reserve(self) -> Ticket:
        """Take a place in the queue or raise ``QueueFull``. One runs, ``queue_max`` wait.

        Background work is not counted: a batch never fills the queue live requests wait in.
        """
        with self._lock:
            if self.closing:
                raise ShuttingDown("the server is shutting down; retry once it is back")
            if self.live >= self.queue_max + 1:
                raise QueueFull(f"the request queue is full ({self.queue_max} waiting); retry later")
            self._admitted += 1
        self._changed()
        return Ticket(self)

    async def reserve_background(self, poll: float = TICK / 5) -> Ticket:
        """A place for background work (a batch line), taken only while no live request is admitted.

        Waits (polling every ``poll`` seconds) while live requests wait or run, so a
        live request is only ever queued behind the background work already admitted.
        """
        while True:
            with self._lock:
                if self.closing:
                    raise ShuttingDown("the server is shutting down")
                admitted = self.live == 0
                if admitted:
                    self._admitted += 1
                    self._background += 1
            if admitted:
                self._changed()
                return Ticket(self, background=True)
            await asyncio.sleep(poll)

    def _release(self, background: bool = False) -> None:
        with self._lock:
            self._admitted -= 1
            if background:
                self._background -= 1
        self._changed()

    def _changed(self) -> None:
        if self.watch is not None:
            self.watch(self._admitted, self._generations)

    # --- progress ---------------------------------------------------------------------
    def begin(self) -> None:
        """A generation starts (its thread; then ``beat`` at every token and ``rest`` at its end)."""
        with self._lock:
            self._generations += 1
        self.beat()
        self._changed()  # the running batch grew (beat reports only the first generation's start)

    def beat(self) -> None:
        """A generation made progress (its thread: at its start and at every token)."""
        starting = self._beat is None
        self._beat = time.monotonic()
        if starting:
            self._changed()

    def rest(self) -> None:
        """A running generation ended (its thread); the stall clock stops when none runs."""
        with self._lock:
            self._generations = max(0, self._generations - 1)
            if self._generations == 0:
                self._beat = None
        self._changed()

    @property
    def generations(self) -> int:
        """Generations running now (more than one only when the engine batches)."""
        return self._generations

    @property
    def generating(self) -> bool:
        """A generation is running on the engine thread."""
        return self._beat is not None

    def stalled_for(self) -> float:
        """Seconds the running generation has gone without progress (0 when none runs)."""
        beat = self._beat
        return 0.0 if beat is None else time.monotonic() - beat

    def stalled(self) -> bool:
        return self.stall_s > 0 and self.stalled_for() > self.stall_s

    def expired(self) -> bool:
        """The shutdown grace has run out."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def why_not_started(self) -> MillmError | None:
        """Why a call that has not started yet should be given up, if it should."""
        if self.expired():
            return ShuttingDown("the server is shutting down; this request did not finish within the grace period")
        if self.stalled():
            return GenerationStalled(
                f"the engine is stuck in a generation that made no progress for {self.stalled_for():.0f} s; retry later"
            )
        return None

    # --- running work -----------------------------------------------------------------
    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue ``fn(*args)`` on the engine thread; the caller waits for the future itself."""
        return self._engine.submit(fn, *args)

    def submit_beside(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` now on a thread of its own (a generation the engine batches with others;
        an idle thread of an earlier one when there is one).

        Admission still bounds how many run: one per admitted request.
        """
        future: Future[T] = Future()
        run = contextvars.copy_context().run  # the request's log context and observation go along
        with self._lock:
            self._beside.add(future)

        def body() -> None:
            try:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    result = run(fn, *args)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            finally:
                with self._lock:
                    self._beside.discard(future)

        self._generation_threads.run(body)
        return future

    async def run(self, fn: Callable[..., T], *args: Any, cancel: threading.Event | None = None) -> T:
        """Run ``fn(*args)`` on the engine thread, in order.

        With ``cancel``, a call that has not started yet is given up (and never
        runs) once ``cancel`` is set, once a generation ahead of it stalls, or
        once the shutdown grace ends.
        """
        return await self._wait(self._engine.submit(self._guarded, fn, args, cancel), cancel)

    async def run_text(self, fn: Callable[..., T], *args: Any, cancel: threading.Event | None = None) -> T:
        """Run ``fn(*args)`` on the text thread (rendering and tokenizing; never model work)."""
        return await self._wait(self._text.submit(self._guarded, fn, args, cancel), cancel)

    @staticmethod
    def _guarded(fn: Callable[..., T], args: tuple, cancel: threading.Event | None) -> T:
        if cancel is not None and cancel.is_set():
            raise RequestCancelled()
        return fn(*args)

    async def _wait(self, future: Future[T], cancel: threading.Event | None) -> T:
        waiter = asyncio.wrap_future(future)
        if cancel is None:
            return await waiter
        # Woken the moment the request is cancelled (its client gone): it leaves the queue at once.
        # The tick remains for a stall, the end of the shutdown grace, or a plugin's plain Event.
        cancelled, forget = when_set(cancel)
        waiting = {waiter} if cancelled is None else {waiter, cancelled}
        try:
            while True:
                done, _ = await asyncio.wait(waiting, timeout=TICK, return_when=asyncio.FIRST_COMPLETED)
                if waiter in done:
                    return waiter.result()
                if cancel.is_set() and future.cancel():
                    raise RequestCancelled()
                waiting.discard(cancelled)  # set, but the call already runs: wait for its end
                error = self.why_not_started()
                if error is not None and future.cancel():
                    cancel.set()
                    raise error
        finally:
            forget()

    def run_sync(
        self, fn: Callable[..., T], *args: Any, timeout: float | None = None, priority: int | None = None
    ) -> T:
        """Run ``fn`` on the engine thread from a non-async thread and wait (``TimeoutError`` past ``timeout``)."""
        if threading.get_ident() == self.engine_thread_id:
            return fn(*args)
        return self._engine.submit(fn, *args, priority=priority).result(timeout)

    def drain(self, timeout: float) -> bool:
        """Wait until the engine thread has run what was queued before now, and the generations
        running beside it have ended (their ``after_generate`` included); False if not in time."""
        deadline = time.monotonic() + timeout
        try:
            self.run_sync(lambda: None, timeout=timeout, priority=LOW)  # behind background calls too
        except TimeoutError:
            return False
        with self._lock:
            beside = list(self._beside)
        for future in beside:
            try:
                future.exception(max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return False
            except CancelledError:
                pass
        return True

    def shutdown(self) -> None:
        self._engine.stop()
        self._text.stop()
