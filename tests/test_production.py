"""Production serving: gunicorn with uvicorn workers, configured by the environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx

from millm_host.testing import free_port, shared_cache_dir
from millm_host.testing.gunicorn import gunicorn, stop, wait_ready


def test_gunicorn_serves_the_app(tmp_path, tiny_model_dir):
    port = free_port()
    env = {
        **os.environ,
        "MILLM_DATA_DIR": str(tmp_path),
        "MILLM_MODEL": str(tiny_model_dir),
        "MILLM_CACHE_DIR": str(shared_cache_dir() / "model-cache"),
    }
    args = [
        "-k",
        "uvicorn_worker.UvicornWorker",
        "-w",
        "1",
        "-b",
        f"127.0.0.1:{port}",
        "millm_host.app:create_app()",
    ]
    proc = gunicorn(args, env, tmp_path / "gunicorn.log")
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(f"{base}/api/health", timeout=2).json()["status"] == "ok":
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        model = httpx.get(f"{base}/api/health").json()["model"]
        reply = httpx.post(
            f"{base}/v1/chat/completions",
            timeout=60,
            json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["role"] == "assistant"
    finally:
        stop(proc, tmp_path / "gunicorn.log")


def test_gunicorn_workers_share_their_metrics(tmp_path, tiny_model_dir):
    """Prometheus multiprocess mode: a scrape of any worker counts every worker's requests."""
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    env = {
        **os.environ,
        "MILLM_DATA_DIR": str(tmp_path),
        "MILLM_MODEL": str(tiny_model_dir),
        "MILLM_CACHE_DIR": str(shared_cache_dir() / "model-cache"),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
    }
    args = [
        "-c",
        "python:millm_host.observability.gunicorn",
        "-k",
        "uvicorn_worker.UvicornWorker",
        "-w",
        "2",
        "-b",
        f"127.0.0.1:{port}",
        "millm_host.app:create_app()",
    ]
    # the schema first: two workers starting at once would both migrate the fresh SQLite file
    subprocess.run([sys.executable, "-m", "millm_host.cli", "db", "upgrade"], env=env, check=True, capture_output=True)
    proc = gunicorn(args, env, tmp_path / "gunicorn.log")
    try:
        base = f"http://127.0.0.1:{port}"
        model = wait_ready(base, 2)
        sent = 8
        for _ in range(sent):  # new connections: the kernel spreads them over the workers
            for _attempt in range(100):  # a worker still loading answers 503 with Retry-After: retry, as clients do
                reply = httpx.post(
                    f"{base}/v1/chat/completions",
                    timeout=60,
                    json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                )
                if reply.status_code != 503:
                    break
                time.sleep(0.2)
            assert reply.status_code == 200
        for _ in range(4):  # each scrape on a new connection, whichever worker answers it
            counted = [
                sample.value
                for family in text_string_to_metric_families(httpx.get(f"{base}/metrics").text)
                for sample in family.samples
                if sample.name == "millm_requests_total" and sample.labels["status"] == "200"
            ]
            assert sum(counted) == sent
        assert len(list(metrics_dir.glob("gauge_livesum_*.db"))) >= 2  # a file per worker (and one of db upgrade)
    finally:
        stop(proc, tmp_path / "gunicorn.log")
