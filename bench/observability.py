"""Metrics and tracing overhead per request: a server with both on against one with both off, in one run.

Two servers on the same model: one records Prometheus metrics and exports a
span per request (queue, prefill, decode children) to an OTLP receiver in this
process; the other has ``MILLM_METRICS=false`` and no OTLP endpoint. Rounds
alternate which server goes first, so both see the same machine load; the
figure is the median of the per-round ratios (on / off) of the median request
latency. The in-process cost of one request's observation (an ``Observation``
made, its timing marked for --tokens tokens, the metrics recorded and the spans
ended) is measured apart and shown beside it: on a shared machine it is the
steadier figure.

    OMP_NUM_THREADS=1 python bench/observability.py [--model PATH] [--rounds 7] [--requests 10] [--tokens 16]

Target (issue 20): at most 1 % per request.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from millm_host.testing.otlp import OtlpReceiver
from millm_host.testing.server import ServerProcess


def latencies(server: ServerProcess, requests: int, tokens: int) -> list[float]:
    body = {
        "model": server.model_id,
        "messages": [{"role": "user", "content": "Write about the sea."}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    out = []
    with server.http(timeout=300) as http:
        for _ in range(requests):
            started = time.perf_counter()
            reply = http.post(
                "/v1/chat/completions", json=body, headers={"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}
            )
            out.append(time.perf_counter() - started)
            reply.raise_for_status()
    return out


def observation_cost(tokens: int, repeats: int = 2000) -> float:
    """Seconds of one request's observation in-process, tracing to a receiver and metrics on."""
    from types import SimpleNamespace

    from millm_host.observability.metrics import Metrics
    from millm_host.observability.request import Observation
    from millm_host.observability.tracing import Tracing

    with OtlpReceiver() as receiver:
        tracing = Tracing(receiver.url)
        host = SimpleNamespace(metrics=Metrics(), tracing=tracing, settings={"MILLM_METRICS": True})
        entry = SimpleNamespace(id="bench")
        started = time.perf_counter()
        for _ in range(repeats):
            observation = Observation(host, "chat.completions", {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"})
            ctx = SimpleNamespace(entry=entry, prompts=[[1] * 32], outputs=[SimpleNamespace(token_ids=[1] * tokens)])
            ctx.streaming, ctx.interrupted, ctx.engine = False, None, None
            observation.ctx = ctx  # type: ignore[assignment]
            timing = observation.timing
            timing.queue()
            timing.start()
            timing.sequence()
            for _ in range(tokens):
                timing.token()
            observation.finish(200)
        cost = (time.perf_counter() - started) / repeats
        tracing.shutdown()
    return cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a model path (default: the bundled default model)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()

    with OtlpReceiver() as receiver, tempfile.TemporaryDirectory() as on_dir, tempfile.TemporaryDirectory() as off_dir:
        on = ServerProcess(
            on_dir,
            model=args.model,
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "200"},
        ).start()
        off = ServerProcess(off_dir, model=args.model, env={"MILLM_METRICS": "false"}).start()
        try:
            for server in (on, off):  # warm up
                latencies(server, 2, args.tokens)
            ratios, on_medians, off_medians = [], [], []
            for round_ in range(args.rounds):
                order = (on, off) if round_ % 2 == 0 else (off, on)
                medians = {id(s): statistics.median(latencies(s, args.requests, args.tokens)) for s in order}
                on_medians.append(medians[id(on)])
                off_medians.append(medians[id(off)])
                ratios.append(medians[id(on)] / medians[id(off)])
            spans = len(receiver.spans)
        finally:
            on.stop()
            off.stop()

    cost = observation_cost(args.tokens)
    request = statistics.median(off_medians)
    print(f"request latency, median: on {statistics.median(on_medians) * 1000:.2f} ms, off {request * 1000:.2f} ms")
    print(
        f"on / off, median of {args.rounds} paired rounds: {statistics.median(ratios):.4f}  (spans received: {spans})"
    )
    print(f"observation in-process: {cost * 1e6:.1f} us per request = {cost / request * 100:.3f} % of the request")


if __name__ == "__main__":
    main()
