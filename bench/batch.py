"""Batch API figures: a scoring batch's lines/s against the same requests sent live, and live p95 under a batch.

One ``millm serve`` on the default model (float32, so ``scoring_precision:
"float32"`` scores it as it is, with no copy). The lines are next-token scoring
requests on ``/v1/completions`` (``max_tokens: 1``, ``logprobs: 2``,
``scoring_precision: "float32"`` unless ``--precision`` says otherwise: the
spec's float32 scoring rows, each scored on its own), each with its own prompt.

1. **Lines per second.** Live: the bodies sent one after another with httpx,
   each waiting for its answer, before and after the batch (the live figure is
   the mean of the two runs, so drift in a shared machine's load hits both).
   Batch: the same bodies as one JSONL file uploaded with the openai SDK, timed
   from ``batches.create`` until ``retrieve`` says ``completed`` (polled every
   2 % of the time so far), nothing else running. Every output line is checked: status 200, the
   scoring precision echoed in ``millm.headers``. Target: batch / live >= 1.0.
2. **Live chat latency under a batch.** ``--live-requests`` short chats
   (``--live-tokens`` tokens, temperature 0), one at a time with ``--live-gap``
   seconds between them (a user reading), with no batch, and again while a second
   batch of the same lines runs at background priority (``admission.BACKGROUND``:
   a line is admitted only while no live request is). p50/p95/max of each, and
   the p95 ratio. Only chats that started and ended while the batch was in
   progress count as "under a batch".

    OMP_NUM_THREADS=1 python bench/batch.py [--lines 1000] [--live-requests 40] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from millm_host.testing import ServerProcess

PROMPT = "[kind] review\n[text] Review number {i}: the soup was cold.\n[question] Is this review positive?\n[decision]:"
DONE = ("completed", "failed", "cancelled", "expired")


def bodies(model: str, count: int, precision: str | None) -> list[dict]:
    extra = {"scoring_precision": precision} if precision else {}
    return [
        {"model": model, "prompt": PROMPT.format(i=i), "max_tokens": 1, "logprobs": 2, "temperature": 0, **extra}
        for i in range(count)
    ]


def live(server: ServerProcess, requests: list[dict]) -> float:
    """Lines per second, one request at a time."""
    with server.http() as http:
        start = time.perf_counter()
        for body in requests:
            reply = http.post("/v1/completions", json=body)
            reply.raise_for_status()
        return len(requests) / (time.perf_counter() - start)


def submit(client, requests: list[dict]) -> str:
    """Upload the lines and create the batch; its id."""
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}
        for i, body in enumerate(requests)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    source = client.files.create(file=("bench.jsonl", data), purpose="batch")
    created = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
    return created.id


def wait(client, batch_id: str):
    """Poll until the batch is done: every 2 % of the time so far (50 ms to 1 s), so polling costs the
    server little and overstates the batch's time by at most 2 %."""
    began = time.perf_counter()
    while (found := client.batches.retrieve(batch_id)).status not in DONE:
        time.sleep(min(1.0, max(0.05, 0.02 * (time.perf_counter() - began))))
    return found


def check_output(client, found, requests: list[dict], precision: str | None) -> None:
    """Every line done, answered 200, with the scoring precision echoed in its ``millm.headers``."""
    counts = found.request_counts
    assert found.status == "completed" and counts.completed == len(requests), found
    output = [json.loads(line) for line in client.files.content(found.output_file_id).text.splitlines()]
    assert sorted(line["custom_id"] for line in output) == sorted(f"r{i}" for i in range(len(requests)))
    for line in output:
        response = line["response"]
        assert response["status_code"] == 200, line
        if precision:
            headers = {k.lower(): v for k, v in response["millm"]["headers"].items()}
            assert headers.get("x-millm-scoring-precision") == precision, line


def batch(server: ServerProcess, requests: list[dict], precision: str | None) -> float:
    """Lines per second of one batch over ``requests``, from create to completed."""
    client = server.openai()
    start = time.perf_counter()
    batch_id = submit(client, requests)
    found = wait(client, batch_id)
    elapsed = time.perf_counter() - start
    check_output(client, found, requests, precision)
    return len(requests) / elapsed


def chat_latencies(server: ServerProcess, count: int, tokens: int, gap: float, until=None) -> list[float]:
    """Seconds per chat, one at a time with ``gap`` between; with ``until``, only while it says go on."""
    body = {
        "model": server.model_id,
        "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    out = []
    with server.http() as http:
        for _ in range(count):
            if until is not None and not until():
                break
            began = time.perf_counter()
            http.post("/v1/chat/completions", json=body).raise_for_status()
            ended = time.perf_counter()
            if until is None or until():  # it ended while the batch still ran
                out.append(ended - began)
            time.sleep(gap)
    return out


def under_batch(server: ServerProcess, requests: list[dict], args: argparse.Namespace) -> tuple[list[float], float]:
    """Chat latencies while a batch runs, and that batch's lines/s."""
    client = server.openai()
    start = time.perf_counter()
    batch_id = submit(client, requests)
    running = threading.Event()
    running.set()
    result = {}

    def watch() -> None:
        result["found"] = wait(server.openai(), batch_id)
        result["elapsed"] = time.perf_counter() - start
        running.clear()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    while client.batches.retrieve(batch_id).status == "validating":
        time.sleep(0.05)
    latencies = chat_latencies(server, args.live_requests, args.live_tokens, args.live_gap, until=running.is_set)
    watcher.join()
    check_output(client, result["found"], requests, args.precision)
    return latencies, len(requests) / result["elapsed"]


def progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000, help="scoring lines in each batch")
    parser.add_argument("--live-requests", type=int, default=40, help="live chats for the p95, with and without")
    parser.add_argument("--live-tokens", type=int, default=8, help="max_tokens of each live chat")
    parser.add_argument("--live-gap", type=float, default=0.1, help="seconds between live chats")
    parser.add_argument("--concurrency", type=int, default=2, help="MILLM_BATCH_CONCURRENCY")
    parser.add_argument(
        "--precision", choices=("float32", "native", "none"), default="float32", help="scoring_precision per line"
    )
    args = parser.parse_args()
    args.precision = None if args.precision == "none" else args.precision
    server = ServerProcess(
        Path(tempfile.mkdtemp(prefix="millm-bench-")), env={"MILLM_BATCH_CONCURRENCY": str(args.concurrency)}
    ).start(600)
    model_id = server.model_id
    try:
        requests = bodies(model_id, args.lines, args.precision)
        live(server, requests[:20])  # warm-up
        chat_latencies(server, 3, args.live_tokens, 0)
        first = live(server, requests)
        progress(f"live {first:.1f} lines/s")
        alone = chat_latencies(server, args.live_requests, args.live_tokens, args.live_gap)
        progress(f"live chats alone: p95 {pct(alone, 0.95) * 1000:.0f} ms")
        batched = batch(server, requests, args.precision)
        progress(f"batch {batched:.1f} lines/s")
        during, batched_with_live = under_batch(server, requests, args)
        progress(f"live chats under a batch: {len(during)}")
        last = live(server, requests)
    finally:
        server.stop()
    sequential = (first + last) / 2
    print(
        f"model {model_id}, {args.lines} scoring lines (/v1/completions, max_tokens 1, logprobs 2, "
        f"scoring_precision {args.precision}), batch concurrency {args.concurrency}"
    )
    print(f"live, one at a time: {sequential:8.1f} lines/s  (runs {first:.1f}, {last:.1f})")
    print(f"batch:               {batched:8.1f} lines/s  (with live chats meanwhile: {batched_with_live:.1f})")
    print(f"ratio batch / live:  {batched / sequential:8.2f}  (target >= 1.0)")
    print(
        f"live chat ({args.live_tokens} tokens, {args.live_gap} s apart), no batch: {len(alone)} chats, "
        f"p50 {pct(alone, 0.5) * 1000:.0f} ms, p95 {pct(alone, 0.95) * 1000:.0f} ms, max {max(alone) * 1000:.0f} ms"
    )
    if during:
        print(
            f"live chat while the batch runs: {len(during)} chats, p50 {pct(during, 0.5) * 1000:.0f} ms, "
            f"p95 {pct(during, 0.95) * 1000:.0f} ms, max {max(during) * 1000:.0f} ms"
        )
        print(f"ratio live p95 under a batch / without: {pct(during, 0.95) / pct(alone, 0.95):8.2f}")
    else:
        print("live chat while the batch runs: none finished before the batch did (use more --lines)")
    print(f"median live chat without a batch: {statistics.median(alone) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
