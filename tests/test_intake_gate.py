"""The intake gate (``millm_host/intake.py``): while a generation runs, requests pass one at a time,
each after a pause in proportion to the intake before it; idle, it is open; a request whose client
leaves gives up its turn. The drop storm it answers is measured by ``bench/drop_storm.py``."""

from __future__ import annotations

import asyncio
import threading
import time

from millm_host.intake import LONGEST_COUNTED_S, IntakeGate


class Flag:
    def __init__(self, value: bool) -> None:
        self.value = value

    def __call__(self) -> bool:
        return self.value


def test_idle_gate_lets_everyone_pass_at_once():
    async def main() -> None:
        gate = IntakeGate(0.1, Flag(False))
        tokens = await asyncio.gather(*(gate.enter(threading.Event()) for _ in range(50)))
        assert tokens == [None] * 50  # nothing to give back, nothing counted
        assert gate.paced == gate.passed == 0

    asyncio.run(main())


def test_share_of_one_or_zero_turns_pacing_off():
    async def main() -> None:
        for share in (0.0, 1.0):
            gate = IntakeGate(share, Flag(True))
            assert await gate.enter(threading.Event()) is None

    asyncio.run(main())


def test_while_generating_requests_pass_one_at_a_time_with_a_pause_after_each():
    share, intake_s = 0.5, 0.01  # a pause as long as the intake before it

    async def request(gate: IntakeGate, spans: list[tuple[float, float]]) -> None:
        token = await gate.enter(threading.Event())
        assert token is not None
        began = time.monotonic()
        await asyncio.sleep(intake_s)  # its intake
        gate.done(token)
        spans.append((began, time.monotonic()))

    async def main() -> None:
        gate = IntakeGate(share, Flag(True))
        spans: list[tuple[float, float]] = []
        await asyncio.gather(*(request(gate, spans) for _ in range(5)))
        assert gate.passed == 5 and gate.paced == 4  # the first found the gate open
        for (_, ended), (began, _) in zip(spans, spans[1:], strict=False):
            took = min(intake_s, LONGEST_COUNTED_S)
            # never two at once, and the next only after the pause (a lower bound: later is allowed)
            assert began >= ended + took * (1 - share) / share - 0.002

    asyncio.run(main())


def test_a_request_whose_client_left_gives_up_its_turn_and_the_next_goes_on():
    async def main() -> None:
        gate = IntakeGate(0.1, Flag(True))
        first = await gate.enter(threading.Event())  # in its intake: the others wait
        gone, staying = threading.Event(), threading.Event()
        waiting_gone = asyncio.ensure_future(gate.enter(gone))
        waiting_staying = asyncio.ensure_future(gate.enter(staying))
        await asyncio.sleep(0.005)
        gone.set()  # that client left while it waited
        gate.done(first)
        assert await waiting_gone is None  # no turn: the caller refuses it as cancelled
        token = await waiting_staying
        assert token is not None
        gate.done(token)
        assert gate.left == 1 and gate.passed == 2

    asyncio.run(main())


def test_the_gate_opens_when_the_generation_ends():
    async def main() -> None:
        generating = Flag(True)
        gate = IntakeGate(0.01, generating)  # a pause of 99 intakes
        first = await gate.enter(threading.Event())
        await asyncio.sleep(LONGEST_COUNTED_S)
        gate.done(first)  # the next would wait ~2 s for its turn
        waiting = asyncio.ensure_future(gate.enter(threading.Event()))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        generating.value = False  # the batch emptied: intake is free again
        await asyncio.wait_for(waiting, 0.5)

    asyncio.run(main())


def test_a_slow_intake_does_not_hold_back_the_next_for_longer_than_it_counts():
    async def main() -> None:
        gate = IntakeGate(0.5, Flag(True))
        slow = await gate.enter(threading.Event())  # never done while the next waits (a stuck hook)
        began = time.monotonic()
        nxt = await asyncio.wait_for(gate.enter(threading.Event()), 1.0)
        assert nxt is not None and time.monotonic() - began >= LONGEST_COUNTED_S - 0.002
        gate.done(slow)
        gate.done(nxt)

    asyncio.run(main())
