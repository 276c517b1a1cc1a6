"""The intake gate (``millm_host/intake.py``): a request whose client leaves before its answer is
charged the time it held the server; while a generation runs, new requests wait until that charge
(times ``(1 - share) / share``) has passed, in the order they came. Idle, the gate is open; a
request whose client leaves while it waits gives up its turn. The drop storm it answers is
measured by ``bench/drop_storm.py``."""

from __future__ import annotations

import asyncio
import threading
import time

from millm_host.intake import LONGEST_CHARGED_S, IntakeGate


class Flag:
    def __init__(self, value: bool) -> None:
        self.value = value

    def __call__(self) -> bool:
        return self.value


def test_requests_that_are_answered_cost_the_ones_behind_them_nothing():
    async def main() -> None:
        gate = IntakeGate(0.1, Flag(True))
        began = time.monotonic()
        await asyncio.gather(*(gate.enter(threading.Event()) for _ in range(50)))
        assert time.monotonic() - began < 1  # no pause without a charge (a loose bound: nothing waits)
        assert gate.paced == 0

    asyncio.run(main())


def test_a_charge_closes_the_gate_for_its_share_while_generating():
    share, held_s = 0.5, 0.01  # closed as long as the dropped request held the server

    async def main() -> None:
        gate = IntakeGate(share, Flag(True))
        gate.charge(held_s)
        closed_until = time.monotonic() + held_s * (1 - share) / share
        await gate.enter(threading.Event())
        assert time.monotonic() >= closed_until - 0.001  # a lower bound: later is allowed
        assert gate.paced == 1 and gate.charged == 1

    asyncio.run(main())


def test_charges_add_up_and_a_long_one_is_charged_as_the_longest():
    async def main() -> None:
        gate = IntakeGate(0.5, Flag(True))
        began = time.monotonic()
        for _ in range(3):
            gate.charge(10.0)  # a request that held the server for ten seconds, then lost its client
        await gate.enter(threading.Event())
        waited = time.monotonic() - began
        assert waited >= 3 * LONGEST_CHARGED_S - 0.001
        assert waited < 3 * LONGEST_CHARGED_S + 1  # not ten seconds (a loose bound)

    asyncio.run(main())


def test_idle_or_with_pacing_off_the_gate_is_open():
    async def main() -> None:
        idle = IntakeGate(0.1, Flag(False))
        idle.charge(LONGEST_CHARGED_S)
        off = IntakeGate(1.0, Flag(True))
        off.charge(LONGEST_CHARGED_S)
        await asyncio.wait_for(asyncio.gather(idle.enter(threading.Event()), off.enter(threading.Event())), 0.05)
        assert idle.paced == off.paced == 0 and off.charged == 0

    asyncio.run(main())


def test_waiters_pass_in_order_and_one_whose_client_left_gives_up_its_turn():
    async def main() -> None:
        gate = IntakeGate(0.1, Flag(True))
        gate.charge(LONGEST_CHARGED_S)  # closed for 180 ms
        passed: list[int] = []
        cancels = [threading.Event() for _ in range(4)]

        async def request(index: int) -> None:
            await gate.enter(cancels[index])
            if not cancels[index].is_set():
                passed.append(index)

        waiting = [asyncio.ensure_future(request(i)) for i in range(4)]
        await asyncio.sleep(0.01)
        cancels[2].set()  # that client left while it waited
        await asyncio.gather(*waiting)
        assert passed == [0, 1, 3]
        assert gate.left == 1 and gate.paced == 4

    asyncio.run(main())


def test_the_gate_opens_when_the_generation_ends():
    async def main() -> None:
        generating = Flag(True)
        gate = IntakeGate(0.01, generating)
        gate.charge(LONGEST_CHARGED_S)  # closed for ~2 s
        waiting = asyncio.ensure_future(gate.enter(threading.Event()))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        generating.value = False  # the batch emptied: intake is free again
        await asyncio.wait_for(waiting, 0.5)

    asyncio.run(main())


def test_a_connection_whose_last_request_was_answered_passes_at_once_until_it_drops_one():
    async def main() -> None:
        gate = IntakeGate(0.1, Flag(True))
        kept, fresh = ("127.0.0.1", 50001), ("127.0.0.1", 50002)
        gate.answered(kept)  # its client read its answer: it kept the connection
        gate.charge(LONGEST_CHARGED_S, fresh)  # a drop on another connection closes the gate for 180 ms
        await asyncio.wait_for(gate.enter(threading.Event(), kept), 0.05)
        assert gate.paced == 0
        waiting = asyncio.ensure_future(gate.enter(threading.Event(), fresh))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # a new connection waits
        gate.charge(0.0, kept)  # the kept connection's client dropped a request: it waits like the rest now
        other = asyncio.ensure_future(gate.enter(threading.Event(), kept))
        await asyncio.sleep(0.01)
        assert not other.done()
        await asyncio.wait_for(asyncio.gather(waiting, other), 1.0)

    asyncio.run(main())
