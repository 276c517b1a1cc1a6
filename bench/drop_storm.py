"""A drop storm: do clients that open streams and drop them at once slow everyone else? (issue 35 §2)

A real ``millm serve`` (continuous batching; a random 4-layer Llama by default,
``--default-model`` for SmolLM2-135M). Six steady clients each ask, one after the
other, for a streamed greedy completion of ``--max-tokens`` tokens, all run long,
and read it whole. Two droppers beside them take turns with quiet: in each storm window each
dropper opens a streamed completion and drops it once its headers are in, again
and again; in each quiet window they do nothing. ``--mode send`` drops instead as
soon as the request is sent (a connection flood: a client can open connections
faster than the server accepts them, and the backlog spills into the next window),
``--mode both`` alternates.

The figure is the steady clients' tokens per second in a storm window over the mean
of the two quiet windows beside it (target ≥ 0.9). Tokens, not completions: the six
run in step in one batch and finish together, so a window of a few seconds counts
completions in waves of six, and two quiet windows of one machine differed by half;
each token arrives on its own (a streamed chunk), so a window counts hundreds: ``--pairs`` storms, each between
two quiet windows of the same length, so a machine whose speed drifts (other
work on it) is compared with itself a few seconds apart. Printed per window and
as the median ratio; beside them, the drops made, how many generations entered
the batch (``/api/health/inference`` ``batched``) against how many left it
waiting (``left_waiting``), the most requests seen waiting during the storm, and
``waiting`` once it ends (it should be 0). The first half second of each window
is not counted (the droppers start or stop then).

The droppers are Python clients on the same machine: every drop costs them CPU too
(opening a connection, sending, reading the headers), and the faster the server
answers, the faster they loop. Each window prints the CPU seconds the droppers'
threads used (``time.thread_time``) and the server process used (``/proc``), and
their share of the machine's cores, so a storm that slows the steady clients by
taking the CPU on the client side is told apart from one the server pays for.

    python bench/drop_storm.py [--seconds 8] [--pairs 4] [--max-tokens 32] [--mode headers|send|both] [--default-model]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from millm_host.testing import ServerProcess  # noqa: E402
from millm_host.testing.tiny_models import tiny_llama  # noqa: E402

STEADY, DROPPERS = 6, 2
SETTLE_S = 0.5  # not counted at the start of a window


def inference(server: ServerProcess) -> dict:
    return httpx.get(f"{server.base_url}/api/health/inference", timeout=30).json()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used, every thread included (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Storm:
    """The steady clients (always on) and the droppers (on while ``dropping`` is set)."""

    def __init__(self, server: ServerProcess, model: str, max_tokens: int, mode: str) -> None:
        self.server, self.model, self.max_tokens, self.mode = server, model, max_tokens, mode
        self.stop, self.dropping = threading.Event(), threading.Event()
        self.done: list[float] = []  # when each steady completion came back
        self.tokens: list[float] = []  # when each of their tokens arrived (a streamed chunk)
        self.refused: list[float] = []  # steady requests answered otherwise (e.g. 503 queue_full)
        self.drops: list[float] = []
        self.dropper_cpu: list[tuple[float, float]] = []  # (when, CPU seconds of one dropper's turn)
        self.threads = [threading.Thread(target=self.steady) for _ in range(STEADY)]
        self.threads += [threading.Thread(target=self.dropper) for _ in range(DROPPERS)]

    def __enter__(self) -> Storm:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.dropping.set()
        for thread in self.threads:
            thread.join()

    def steady(self) -> None:
        body = {"model": self.model, "prompt": "Once upon a time", "max_tokens": self.max_tokens, "temperature": 0}
        body["stream"] = True
        with httpx.Client(base_url=self.server.base_url, timeout=300) as http:
            while not self.stop.is_set():
                with http.stream("POST", "/v1/completions", json=body) as response:
                    if response.status_code != 200:
                        response.read()
                        self.refused.append(time.monotonic())
                        continue
                    for line in response.iter_lines():
                        if line.startswith("data: {"):
                            self.tokens.append(time.monotonic())
                self.done.append(time.monotonic())

    def dropper(self) -> None:
        body = {"model": self.model, "prompt": "Tell me a long story", "max_tokens": 4 * self.max_tokens}
        body["stream"] = True
        payload = json.dumps(body).encode()
        with httpx.Client(base_url=self.server.base_url, timeout=300) as http:
            while not self.stop.is_set():
                if not self.dropping.wait(0.1) or self.stop.is_set():
                    continue
                began = time.thread_time()  # this thread's own CPU: what the drop cost the client
                try:
                    if self.mode == "headers" or (self.mode == "both" and len(self.drops) % 2):
                        with http.stream("POST", "/v1/completions", json=body) as response:
                            response.status_code  # noqa: B018 (the headers are in: drop it)
                    else:
                        self.drop_after_send(payload)
                    self.drops.append(time.monotonic())
                except (httpx.HTTPError, OSError):
                    time.sleep(0.01)
                self.dropper_cpu.append((time.monotonic(), time.thread_time() - began))

    def drop_after_send(self, payload: bytes) -> None:
        """Send a whole streamed request and close the socket before any answer."""
        with socket.create_connection(("127.0.0.1", self.server.port)) as sock:
            head = (
                "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            )
            sock.sendall(head.encode() + payload)

    def window(self, seconds: float, dropping: bool) -> dict:
        """One window: the steady clients' tokens per second (after ``SETTLE_S``), its drops and the batch's counters."""
        (self.dropping.set if dropping else self.dropping.clear)()
        start = time.monotonic()
        before = inference(self.server)
        server_cpu = process_cpu(self.server.proc.pid)
        most_waiting = 0
        while time.monotonic() < start + seconds:
            most_waiting = max(most_waiting, inference(self.server)["waiting"])
            time.sleep(0.2)
        end = time.monotonic()
        server_cpu = process_cpu(self.server.proc.pid) - server_cpu
        after = inference(self.server)
        counted = start + SETTLE_S
        return {
            "seconds": end - start,
            "server_cpu": server_cpu,
            "dropper_cpu": sum(cpu for t, cpu in self.dropper_cpu if start <= t < end),
            "dropping": dropping,
            "per_s": sum(counted <= t < end for t in self.tokens) / (end - counted),
            "completions": sum(counted <= t < end for t in self.done),
            "refused": sum(start <= t < end for t in self.refused),
            "drops": sum(start <= t < end for t in self.drops),
            "batched": after["batched"] - before["batched"],
            "left_waiting": after.get("left_waiting", 0) - before.get("left_waiting", 0),
            "most_waiting": most_waiting,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0, help="each window")
    parser.add_argument("--pairs", type=int, default=4, help="storm windows (each between two quiet ones)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--mode", choices=("headers", "send", "both"), default="headers", help="when droppers drop")
    parser.add_argument("--default-model", action="store_true", help="SmolLM2-135M-Instruct instead of a tiny model")
    args = parser.parse_args()
    model_dir = None
    if not args.default_model:
        model_dir = tiny_llama("drop-storm", hidden_size=256, num_hidden_layers=4, intermediate_size=512)
    env = {"MILLM_BATCHING": "continuous"}
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as data, ServerProcess(Path(data), model=model_dir, env=env) as server:
        with Storm(server, server.model_id, args.max_tokens, args.mode) as storm:
            storm.window(min(3.0, args.seconds), False)  # warm up
            windows = [storm.window(args.seconds, False)]
            for _ in range(args.pairs):
                windows.append(storm.window(args.seconds, True))
                windows.append(storm.window(args.seconds, False))
            storm.dropping.clear()
            time.sleep(0.3)
            settled = inference(server)  # the storm is over: nothing of a dropped request is left
    cores = os.cpu_count() or 1
    print(f"{STEADY} steady clients, {DROPPERS} droppers ({args.mode}), windows of {args.seconds:g} s, {cores} cores")
    ratios, dropper_share, server_extra, per_drop = [], [], [], []
    for index, window in enumerate(windows):
        cpu_s = window["seconds"] * cores
        line = (
            f"  {'storm' if window['dropping'] else 'quiet'}: {window['per_s']:.1f} tokens/s "
            f"({window['completions']} completions); "
            f"server CPU {window['server_cpu']:.1f} s"
        )
        if window["dropping"]:
            quiet = [windows[index - 1], windows[index + 1]]
            beside = statistics.mean([w["per_s"] for w in quiet])
            ratio = window["per_s"] / beside if beside else math.nan  # no token came: windows too short
            if beside:
                ratios.append(ratio)
            dropper_share.append(window["dropper_cpu"] / cpu_s)
            extra = window["server_cpu"] - statistics.mean([w["server_cpu"] for w in quiet])
            server_extra.append(extra / cpu_s)
            per_drop.append(
                (1000 * extra / max(1, window["drops"]), 1000 * window["dropper_cpu"] / max(1, window["drops"]))
            )
            line += (
                f", droppers' own CPU {window['dropper_cpu']:.1f} s ({100 * dropper_share[-1]:.0f}% of the "
                f"machine) (x{ratio:.2f}), {window['drops']} drops, batched +{window['batched']}, "
                f"left waiting +{window['left_waiting']}, waiting at most {window['most_waiting']}"
            )
        if window["refused"]:
            line += f", {window['refused']} steady requests refused"
        print(line)
    print(f"after the storm: waiting {settled['waiting']}, admitted {settled['admitted']}")
    print(f"load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(
        f"a storm window: the droppers (clients on this machine) used {100 * statistics.median(dropper_share):.0f}% "
        f"of its CPU, the server {100 * statistics.median(server_extra):.0f}% more than in the quiet windows beside it "
        "(medians): CPU the steady clients' generations did not get"
    )
    print(
        f"a drop cost the server {statistics.median(d[0] for d in per_drop):.1f} ms of CPU beyond the quiet windows' "
        f"and its dropper {statistics.median(d[1] for d in per_drop):.1f} ms (medians)"
    )
    if not ratios:
        print("no token came in a quiet window: use longer --seconds")
        return
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
    print(
        f"ratio, storm over quiet (median of {len(ratios)}, spread {spread}): {statistics.median(ratios):.2f}"
        "  (target >= 0.90)"
    )


if __name__ == "__main__":
    main()
