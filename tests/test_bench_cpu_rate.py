"""``bench/continuous_batching.py`` reads a server's CPU time from ``/proc`` for its tokens per CPU-second."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "continuous_batching.py"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux /proc")
def test_cpu_seconds_of_a_process_follow_its_own_clock():
    spec = importlib.util.spec_from_file_location("bench_continuous_batching", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH.parent))  # its sibling modules, as when it runs as a script
    try:
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(BENCH.parent))
    before, own = bench.cpu_seconds(os.getpid()), time.process_time()
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn 0.3 s of CPU
        pass
    spent, own_spent = bench.cpu_seconds(os.getpid()) - before, time.process_time() - own
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert abs(spent - own_spent) <= 3 * tick + 0.02
    assert bench.load() >= 0
