"""A test server's start: forked from the test zygote against exec'd, as the suite starts them.

Each round starts one ``millm serve`` of each kind on the tiny random model (``tiny_llama``, the
test-only plugins, a fresh data directory: what ``server_factory`` does), waits until
``/api/health`` says ``ok`` (polled every 0.2 s, as ``ServerProcess.ready`` polls), then stops it.
The kinds take turns, so background load hits both alike. The zygote's own start, once per test
session, is timed apart. Prints medians and the ratio of the medians.

    python bench/zygote_start.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from millm_host.testing import zygote
from millm_host.testing.server import ServerProcess
from millm_host.testing.tiny_models import tiny_llama


def start_once(model: Path, root: Path, forked: bool) -> float:
    os.environ["MILLM_TEST_ZYGOTE"] = "1" if forked else "0"
    server = ServerProcess(Path(tempfile.mkdtemp(dir=root)), model=str(model))
    began = time.monotonic()
    server.start()
    took = time.monotonic() - began
    kind = type(server.proc).__name__
    server.stop()
    assert (kind == "ForkedProcess") == forked, kind
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    model = tiny_llama()
    with tempfile.TemporaryDirectory() as root:
        first = start_once(model, Path(root), forked=True)  # starts the zygote first
        print(f"the zygote's start (once per test session) and its first server: {first:.2f} s")
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.runs):
            for forked in (False, True):
                times[forked].append(start_once(model, Path(root), forked))
        zygote.stop()
    exec_s, fork_s = statistics.median(times[False]), statistics.median(times[True])
    print(f"exec'd: median {exec_s:.2f} s over {args.runs} ({', '.join(f'{t:.2f}' for t in times[False])})")
    print(f"forked: median {fork_s:.2f} s over {args.runs} ({', '.join(f'{t:.2f}' for t in times[True])})")
    print(f"ratio exec'd / forked: {exec_s / fork_s:.2f}x; saved per server start: {exec_s - fork_s:.2f} s")


if __name__ == "__main__":
    main()
