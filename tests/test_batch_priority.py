"""Batch lines are background work: admitted only while no live request is, never filling the live queue."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from millm_host.errors import QueueFull, ShuttingDown
from millm_host.scheduler import BACKGROUND, Scheduler


def run(coro):
    return asyncio.run(coro)


def test_background_work_waits_while_a_live_request_is_admitted():
    async def scenario():
        scheduler = Scheduler(queue_max=4)
        live = scheduler.reserve()
        waiting = asyncio.create_task(scheduler.reserve_background(poll=0.001))
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert not waiting.done()  # a live request waits or runs: the batch line is not admitted
        live.release()
        ticket = await asyncio.wait_for(waiting, 30)
        assert ticket.background and scheduler.admitted == 1 and scheduler.live == 0
        ticket.release()
        assert scheduler.admitted == 0
        scheduler.shutdown()

    run(scenario())


def test_background_work_never_fills_the_live_queue():
    async def scenario():
        scheduler = Scheduler(queue_max=0)  # one runs, none waits
        batch = [await scheduler.reserve_background(), await scheduler.reserve_background()]
        live = scheduler.reserve()  # not refused: batch lines do not count
        with pytest.raises(QueueFull):
            scheduler.reserve()
        for ticket in (*batch, live):
            ticket.release()
        scheduler.shutdown()

    run(scenario())


def test_background_work_is_refused_once_shutdown_begins():
    async def scenario():
        scheduler = Scheduler(queue_max=4)
        scheduler.closing = True
        with pytest.raises(ShuttingDown):
            await scheduler.reserve_background()
        scheduler.shutdown()

    run(scenario())


def test_a_live_call_runs_before_batch_calls_queued_ahead_of_it():
    """A batch line admitted before the live request came may be queued on the engine thread already:
    the live call still goes first, so it waits only for the call that is running."""
    order: list[str] = []

    async def scenario():
        scheduler = Scheduler(queue_max=4)
        started, gate = threading.Event(), threading.Event()
        running = scheduler.submit(lambda: (started.set(), gate.wait()))
        await asyncio.to_thread(started.wait)

        async def batch_line(name: str) -> None:
            BACKGROUND.set(True)  # as the batch runner's task does
            await scheduler.run(order.append, name)

        async def queued(count: int) -> None:
            while scheduler._engine._jobs.qsize() < count:
                await asyncio.sleep(0.001)

        lines = [asyncio.create_task(batch_line("batch 1")), asyncio.create_task(batch_line("batch 2"))]
        await queued(2)
        live = asyncio.create_task(scheduler.run(order.append, "live"))
        await queued(3)
        gate.set()
        await asyncio.gather(live, *lines, asyncio.wrap_future(running))
        scheduler.shutdown()

    run(scenario())
    assert order == ["live", "batch 1", "batch 2"]


def test_drain_and_stop_wait_for_queued_batch_calls():
    order: list[str] = []
    scheduler = Scheduler(queue_max=4)
    started, gate = threading.Event(), threading.Event()
    scheduler.submit(lambda: (started.set(), gate.wait()))
    started.wait()
    token = BACKGROUND.set(True)
    try:
        batch = scheduler.submit(order.append, "batch")
    finally:
        BACKGROUND.reset(token)
    drained = concurrent.futures.ThreadPoolExecutor(1).submit(scheduler.drain, 60)
    scheduler.shutdown()  # the stop, too, comes after the batch call
    gate.set()
    assert drained.result(60) is True and batch.result(60) is None and order == ["batch"]
    assert scheduler._engine.join(60)


def test_drain_waits_for_generations_running_beside_the_engine_thread():
    """A batching engine's generations run on threads of their own: a stop that did not wait for them
    would lose what their plugins write as they end (a cancelled request's probe results)."""
    scheduler = Scheduler(queue_max=4)
    gate, ended = threading.Event(), []
    scheduler.submit_beside(lambda: (gate.wait(), ended.append("generation")))
    drained = concurrent.futures.ThreadPoolExecutor(1).submit(scheduler.drain, 60)
    with pytest.raises(concurrent.futures.TimeoutError):
        drained.result(0.3)
    gate.set()
    assert drained.result(60) is True and ended == ["generation"]
    held = threading.Event()
    scheduler.submit_beside(held.wait)
    assert scheduler.drain(0.2) is False  # one that does not end in time: the stop goes on without it
    held.set()
    scheduler.shutdown()


def test_the_running_batch_size_counts_every_generation_of_a_batching_engine():
    """``millm_running_batch_size`` follows the generations running at once, not only whether one runs."""
    scheduler = Scheduler(queue_max=4)
    seen: list[int] = []
    scheduler.watch = lambda admitted, running: seen.append(running)
    try:
        scheduler.begin()
        scheduler.begin()
        assert seen[-1] == 2
        scheduler.rest()
        assert seen[-1] == 1
        scheduler.rest()
        assert seen[-1] == 0
    finally:
        scheduler.shutdown()
