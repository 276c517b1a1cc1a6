"""Probe overhead: two dense probes armed against none, on the real default model.

Per request: a prompt of --prompt-tokens (>= 1,000) with max_tokens=1, so the
prompt pass, the scoring and the recording dominate. Per generated token:
(time at N tokens - time at 1 token) / (N - 1), short prompt. Armed and unarmed
runs are interleaved on one server (the order alternates each round), so both
see the same machine load; medians of --runs each. The server's own measurement
(GET /api/probes/status, last_request.overhead_ms) is printed beside it.

    OMP_NUM_THREADS=1 .venv/bin/python bench/probe_overhead.py [--runs 7] [--prompt-tokens 1024] [--gen-tokens 64]

Targets (spec): under 5 ms per request, under 2 % per generated token.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

from millm_host.testing.server import ServerProcess, test_cache_dir

PROBES = (("bench-mean", 10, "mean", 1), ("bench-max", 20, "max", 2))


def definition(identity: dict, name: str, layer: int, rule: str, seed: int, vectors: list[dict]) -> dict:
    rng = np.random.default_rng(seed)
    d = identity["d_model"]
    return {
        "format": "mi.probe.definition/v1",
        "provenance": {"probe_id": f"prb_{name}", "producer": "bench"},
        "name": name,
        "model": {k: identity[k] for k in ("hf_id", "revision", "d_model", "n_layers", "chat_template_sha256")},
        "read": {"layer": layer, "hook_point": "resid_post"},
        "scope": "all",
        "basis": "residual",
        "sae": None,
        "head": {"weights": rng.normal(size=d).tolist(), "bias": 0.0,
                 "norm_mean": rng.normal(scale=0.1, size=d).tolist(),
                 "norm_std": rng.uniform(0.5, 2, size=d).tolist()},
        "aggregation": {"rule": rule, "params": {}, "skip_template_prefix": True},
        "decision": {"threshold": 0.0, "target_fpr": 0.01, "threshold_source": "bench", "windows": ["all"]},
        "evidence": {"rung": 2},
        "test_vectors": vectors,
    }


def import_probe(http, identity: dict, name: str, layer: int, rule: str, seed: int, vector_ids: list[int]) -> str:
    """Import a probe whose test vector was recorded by stateless scoring on this model, so parity passes."""
    draft = http.post("/api/probes/import", json=definition(identity, f"{name}-draft", layer, rule, seed, [])).json()
    scored = http.post("/api/probes/score", json={"probe_ids": [draft["id"]], "windows": ["all"],
                                                  "inputs": [{"token_ids": vector_ids}]}).json()
    http.delete(f"/api/probes/{draft['id']}")
    score = scored["results"][0]["results"][0]["score"]
    doc = definition(identity, name, layer, rule, seed, [{"token_ids": vector_ids, "score": score}])
    response = http.post("/api/probes/import", json=doc)
    response.raise_for_status()
    return response.json()["id"]


def timed(http, body: dict) -> tuple[float, int]:
    began = time.perf_counter()
    response = http.post("/v1/completions", json=body)
    elapsed = time.perf_counter() - began
    response.raise_for_status()
    return elapsed, response.json()["usage"]["completion_tokens"]


def run(args: argparse.Namespace) -> None:
    server = ServerProcess(tempfile.mkdtemp(prefix="millm-bench-"),
                           env={"MILLM_CACHE_DIR": str(test_cache_dir() / "model-cache")})
    server.start(600)
    try:
        with server.http(timeout=600) as http:
            model_id = http.get("/api/health").json()["model"]
            identity = http.get(f"/api/models/{model_id}").json()
            rng = np.random.default_rng(0)
            long_prompt = [1] + rng.integers(100, 40000, args.prompt_tokens - 1).tolist()
            short_prompt = long_prompt[:16]
            probes = [import_probe(http, identity, name, layer, rule, seed, long_prompt[:48])
                      for name, layer, rule, seed in PROBES]

            def arm(on: bool) -> None:
                for probe_id in probes:
                    http.post(f"/api/probes/{probe_id}/{'arm' if on else 'disarm'}", json={}).raise_for_status()

            base = {"model": model_id, "temperature": 0}
            request_body = {**base, "prompt": long_prompt, "max_tokens": 1}
            one_body = {**base, "prompt": short_prompt, "max_tokens": 1}
            many_body = {**base, "prompt": short_prompt, "max_tokens": args.gen_tokens}
            for on in (False, True):  # warm both paths once
                arm(on)
                timed(http, request_body)
                timed(http, many_body)
            samples: dict[bool, dict[str, list[float]]] = {on: {"request": [], "token": []} for on in (False, True)}
            server_overhead: list[float] = []
            generated: set[int] = set()
            for round_ in range(args.runs):
                for on in ((False, True) if round_ % 2 == 0 else (True, False)):
                    arm(on)
                    samples[on]["request"].append(timed(http, request_body)[0])
                    if on:
                        server_overhead.append(http.get("/api/probes/status").json()["last_request"]["overhead_ms"])
                    one, _ = timed(http, one_body)
                    many, tokens = timed(http, many_body)
                    generated.add(tokens)
                    samples[on]["token"].append((many - one) / max(tokens - 1, 1))
            arm(False)
    finally:
        server.stop()

    def median_ms(on: bool, kind: str) -> float:
        return statistics.median(samples[on][kind]) * 1000

    off_req, on_req = median_ms(False, "request"), median_ms(True, "request")
    off_tok, on_tok = median_ms(False, "token"), median_ms(True, "token")
    print(f"model {model_id} ({identity.get('dtype')}, {identity.get('device')}); two dense probes armed "
          f"(layers {PROBES[0][1]} and {PROBES[1][1]}, resid_post, rules mean and max) against none; "
          f"{args.runs} interleaved runs each, medians")
    print(f"per request, prompt {args.prompt_tokens} tokens, max_tokens 1: unarmed {off_req:.1f} ms, armed {on_req:.1f} ms"
          f" -> overhead {on_req - off_req:+.2f} ms (target < 5 ms), ratio {on_req / off_req:.4f}")
    print(f"  server-measured probe overhead per request (status.last_request.overhead_ms): "
          f"median {statistics.median(server_overhead):.2f} ms, max {max(server_overhead):.2f} ms")
    print(f"per generated token ({sorted(generated)} tokens generated): unarmed {off_tok:.2f} ms, armed {on_tok:.2f} ms"
          f" -> ratio {on_tok / off_tok:.4f} ({(on_tok / off_tok - 1) * 100:+.2f} %, target < 2 %)")


def main() -> None:
    parser = argparse.ArgumentParser(description="Probe overhead on the default model")
    parser.add_argument("--runs", type=int, default=7, help="interleaved runs per mode (>= 5)")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length for the per-request figure")
    parser.add_argument("--gen-tokens", type=int, default=64, help="tokens generated for the per-token figure")
    args = parser.parse_args()
    if args.runs < 5 or args.prompt_tokens < 1000:
        parser.error("use at least 5 runs and a prompt of at least 1,000 tokens")
    run(args)


if __name__ == "__main__":
    main()
