"""Lines/s of a scoring batch (/v1/batches) against the same requests sent live one at a time.

One ``millm serve`` on the default model. The requests are next-token scoring
requests on ``/v1/completions`` (``max_tokens: 1``, ``logprobs: 2``), each with
its own prompt. Live: sent one after another with httpx, each waiting for its
answer. Batch: the same bodies as a JSONL file, uploaded with the openai SDK,
timed from ``batches.create`` until ``retrieve`` says ``completed`` (polled
every 50 ms). Both in the same run, after a warm-up, live first and last (the
live figure is the mean of the two), so drift in a shared machine's load hits
both. The target is batch / live >= 1.0.

    python bench/batch.py [--lines 1000] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from millm_host.testing import ServerProcess

PROMPT = "[kind] review\n[text] Review number {i}: the soup was cold.\n[question] Is this review positive?\n[decision]:"


def bodies(model: str, count: int) -> list[dict]:
    return [
        {"model": model, "prompt": PROMPT.format(i=i), "max_tokens": 1, "logprobs": 2, "temperature": 0}
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


def batch(server: ServerProcess, requests: list[dict]) -> float:
    """Lines per second of one batch over ``requests``, from create to completed."""
    client = server.openai()
    lines = [
        {"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}
        for i, body in enumerate(requests)
    ]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    source = client.files.create(file=("bench.jsonl", data), purpose="batch")
    start = time.perf_counter()
    created = client.batches.create(input_file_id=source.id, endpoint="/v1/completions", completion_window="24h")
    while (found := client.batches.retrieve(created.id)).status not in ("completed", "failed", "cancelled"):
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    counts = found.request_counts
    assert found.status == "completed" and counts.completed == len(requests), found
    return len(requests) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=2, help="MILLM_BATCH_CONCURRENCY")
    args = parser.parse_args()
    server = ServerProcess(
        Path(tempfile.mkdtemp(prefix="millm-bench-")), env={"MILLM_BATCH_CONCURRENCY": str(args.concurrency)}
    ).start()
    try:
        requests = bodies(server.model_id, args.lines)
        live(server, requests[:20])  # warm-up
        first = live(server, requests)
        batched = batch(server, requests)
        last = live(server, requests)
        sequential = (first + last) / 2
        print(f"model {server.model_id}, {args.lines} scoring lines, batch concurrency {args.concurrency}")
        print(f"live, one at a time: {sequential:8.1f} lines/s  (runs {first:.1f}, {last:.1f})")
        print(f"batch:               {batched:8.1f} lines/s")
        print(f"ratio batch / live:  {batched / sequential:8.2f}  (target >= 1.0)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
