"""Scoring off the model's thread starts no OpenMP team beside the model's.

The transformers engine gives the model's thread every core and other threads one
(``millm_engine_transformers.intraop``): GNU OpenMP throttles all teams once their
threads outnumber the CPUs. torch applies that one-thread default to a thread at its
first parallel kernel, but a matrix product goes straight to MKL, which starts a team
of every core. The probes score on the generation's thread (``after_generate``), where
the product may be the first torch call.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

from millm_probes.scoring.bank import Bank, CompiledProbe


def native_threads() -> int:
    """Threads of this process that Python did not start: OpenMP team members (and other native pools)."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def test_scoring_on_a_new_thread_starts_no_team():
    from millm_engine_transformers.intraop import IntraOp

    if IntraOp.confine(torch.device("cpu")) is None:  # as the engine does when it loads on a CPU
        pytest.skip("one CPU, or a torch without OpenMP: there is one team anyway")
    point = (3, "resid_post")
    probes = [CompiledProbe(f"p{i}", point, torch.randn(576), 0.5, None, None) for i in range(2)]
    bank = Bank(probes)
    rows = {point: torch.randn(256, 576)}  # a 256-token request's residuals at the probes' layer
    before = native_threads()
    counted: list[int] = []
    scored = threading.Event()
    hold = threading.Event()

    def generation_thread() -> None:  # its first torch call is the scoring
        try:
            bank.columns(rows)
            counted.append(native_threads())
        finally:
            scored.set()
        hold.wait()  # a team lives as long as the thread that started it

    thread = threading.Thread(target=generation_thread)
    thread.start()
    try:
        assert scored.wait(60)
        assert counted == [before]
    finally:
        hold.set()
        thread.join()
