"""guidellm: a short synchronous benchmark through its CLI, with its default backend check.

Before it sends a request guidellm checks the backend with ``GET /health`` (its default);
then three synthetic prompts, tokenized with the served checkpoint's tokenizer, go one at a
time to ``/v1/chat/completions``, streamed. It runs as a subprocess (its workers are spawned
processes), with the network guard loaded into each of them.
"""

from __future__ import annotations

import json
import subprocess
import sys

REQUESTS = 3
OUTPUT_TOKENS = 4


def test_synchronous_benchmark(server, model, tiny_model_dir, offline_env, tmp_path):
    report = tmp_path / "benchmarks.json"
    command = [
        *(sys.executable, "-m", "guidellm", "run"),
        *("--backend", f"kind=openai_http,target={server.base_url},model={model}"),
        *("--profile", "kind=synchronous"),
        *("--constraint", f"kind=max_requests,count={REQUESTS}"),
        *("--data", f"kind=synthetic_text,prompt_tokens=16,output_tokens={OUTPUT_TOKENS}"),
        *("--tokenizer", f"kind=huggingface_auto,model={tiny_model_dir}"),
        *("--output", f"kind=json,path={report}"),
        "--disable-console",
    ]
    run = subprocess.run(command, env=offline_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    (benchmark,) = json.loads(report.read_text())["benchmarks"]
    totals = benchmark["metrics"]["request_totals"]
    assert (totals["successful"], totals["errored"], totals["incomplete"]) == (REQUESTS, 0, 0)
    assert "GET /health " in server.log()
