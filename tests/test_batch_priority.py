"""Batch lines are background work: admitted only while no live request is, never filling the live queue."""

from __future__ import annotations

import asyncio

import pytest

from millm_host.errors import QueueFull, ShuttingDown
from millm_host.scheduler import Scheduler


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
