"""Production serving: gunicorn with uvicorn workers, configured by the environment."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from millm_host.testing import free_port, shared_cache_dir


def test_gunicorn_serves_the_app(tmp_path, tiny_model_dir):
    port = free_port()
    env = {
        **os.environ,
        "MILLM_DATA_DIR": str(tmp_path),
        "MILLM_MODEL": str(tiny_model_dir),
        "MILLM_CACHE_DIR": str(shared_cache_dir() / "model-cache"),
    }
    cmd = [
        sys.executable,
        "-m",
        "gunicorn",
        "-k",
        "uvicorn_worker.UvicornWorker",
        "-w",
        "1",
        "-b",
        f"127.0.0.1:{port}",
        "millm_host.app:create_app()",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
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
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
