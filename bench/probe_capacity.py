"""Probe capacity: measure the model, arm as many dense probes as fit in 5 %, and check the live overhead.

1. POST /api/models/{id}/probe-capacity/measure times the model's own step and the
   probes' unit costs; the recommendation says how many dense probes fit the 5 % budget.
2. That many dense probes (one layer, one behaviour) are imported and armed in one call,
   through every gate (the cost gate included). ``PROBE_MAX_ARMED`` (64, a backstop) is
   raised to that count for the run when it is smaller: the server is restarted on the
   same data directory (the measurement is kept) with the new backstop.
3. The live overhead is measured in the same run, armed against none, interleaved rounds
   (the order alternates), medians of the per-round paired differences:
   - per generated token: the median interval between a streamed chat's tokens;
   - per request: a chat with a prompt of about --prompt-tokens and --gen-tokens generated.
   Both are checked against the budget (5 % of the model's own time for that request).
4. The cost model is checked against the server's own figures for the same requests
   (GET /api/probes/status ``last_request``): a request's own work (``request_ms``) against
   the costed per-request and per-result work and scoring, and the read hooks against the
   costed callbacks, per generated token's pass and for the prompt's pass.

    OMP_NUM_THREADS=1 python bench/probe_capacity.py [--model PATH] [--runs 5] [--gen-tokens 32]
        [--prompt-tokens 1000] [--layer 10] [--max-armed N]

About 5 minutes on an idle 2-core machine with the default model (import and arming of some
thousand probes included); the time each phase took is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from millm_host.testing.server import ServerProcess

BEHAVIOUR = "bench-dense"
BACKSTOP = 64  # PROBE_MAX_ARMED's default
WITHIN = 0.25  # the costed figure should predict the live one within this share


BASIS = 8  # drafts scored on the server; each probe's weights are a mix of their directions


def definition(identity: dict, name: str, layer: int, weights: list[float], vectors: list[dict]) -> dict:
    """A dense (mean) probe reading ``layer`` with ``weights`` (no normalisation, no bias)."""
    return {
        "format": "mi.probe.definition/v1",
        "provenance": {"probe_id": f"prb_{name}", "producer": "bench"},
        "name": name,
        "model": {k: identity[k] for k in ("hf_id", "revision", "d_model", "n_layers", "chat_template_sha256")},
        "read": {"layer": layer, "hook_point": "resid_post"},
        "scope": "all",
        "basis": "residual",
        "sae": None,
        "head": {"weights": weights, "bias": 0.0},
        "aggregation": {"rule": "mean", "params": {}, "skip_template_prefix": True},
        "decision": {"threshold": 0.0, "target_fpr": 0.01, "threshold_source": "bench", "windows": ["all"]},
        "evidence": {"rung": 2},
        "test_vectors": vectors,
    }


def import_dense(http, identity: dict, count: int, layer: int, vector_ids: list[int]) -> list[str]:
    """``count`` dense probes of one behaviour, each with a test vector scored here, so parity passes.

    A mean probe's score is linear in its weights: ``BASIS`` drafts are imported and scored on the vector
    in one stateless call, and each probe's weights are a random mix of theirs, its score the same mix of
    their scores (to float32 rounding, far inside parity's 1e-3). One import per probe, not three."""
    rng = np.random.default_rng(0)
    basis = (
        rng.normal(size=(BASIS, identity["d_model"])) / identity["d_model"] ** 0.5
    )  # small: float32 rounding stays tiny
    drafts = []
    for k in range(BASIS):
        response = http.post(
            "/api/probes/import", json=definition(identity, f"bench-basis-{k}", layer, basis[k].tolist(), [])
        )
        response.raise_for_status()
        drafts.append(response.json()["id"])
    scored = http.post(
        "/api/probes/score", json={"probe_ids": drafts, "windows": ["all"], "inputs": [{"token_ids": vector_ids}]}
    )
    scored.raise_for_status()
    by_id = {r["probe_id"]: r["score"] for r in scored.json()["results"][0]["results"]}
    scores = np.array([by_id[d] for d in drafts])
    for draft in drafts:
        http.delete(f"/api/probes/{draft}").raise_for_status()
    ids = []
    for i in range(count):
        mix = rng.normal(size=BASIS)
        vectors = [{"token_ids": vector_ids, "score": float(mix @ scores)}]
        doc = {
            **definition(identity, f"bench-dense-{i}", layer, (mix @ basis).tolist(), vectors),
            "behaviour": BEHAVIOUR,
        }
        response = http.post("/api/probes/import", json=doc)
        response.raise_for_status()
        ids.append(response.json()["id"])
    return ids


def server_cpu(server: ServerProcess) -> float:
    """CPU seconds the server process has used, every thread (Linux: /proc; else nan). Steadier than wall
    time on a shared machine: time the server waits for a core is not in it."""
    try:
        fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, AttributeError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def chat_interval(http, body: dict) -> float:
    """Median time between a streamed chat's content chunks (robust to a stall)."""
    arrivals = []
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                    arrivals.append(time.perf_counter())
    gaps = [b - a for a, b in zip(arrivals[1:], arrivals[2:], strict=False)]  # the first gap has the prompt pass
    return statistics.median(gaps)


def chat_request(http, body: dict) -> tuple[float, int]:
    """Wall seconds of one non-streaming chat, and its prompt's tokens."""
    began = time.perf_counter()
    response = http.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - began
    response.raise_for_status()
    return elapsed, response.json()["usage"]["prompt_tokens"]


def ratio_line(label: str, live: float, costed: float) -> str:
    share = costed / live if live else float("inf")
    verdict = "within" if abs(share - 1) <= WITHIN else "NOT within"
    return f"  {label}: live {live:.4f} ms, costed {costed:.4f} ms, costed/live {share:.3f} ({verdict} {WITHIN:.0%})"


def run(args: argparse.Namespace) -> None:
    clock = time.perf_counter()
    phases: list[tuple[str, float]] = []

    def phase(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        phases.append((name, now - clock))
        clock = now

    data_dir = tempfile.mkdtemp(prefix="millm-bench-")
    server = ServerProcess(data_dir, model=args.model)
    server.start(600)
    try:
        with server.http(timeout=900) as http:
            model_id = http.get("/api/health").json()["model"]
            identity = http.get(f"/api/models/{model_id}").json()
            layer = min(args.layer, identity["n_layers"] - 2)
            capacity = http.post(f"/api/models/{model_id}/probe-capacity/measure")
            capacity.raise_for_status()
            capacity = capacity.json()
        phase("measure")
        measurement = capacity["measurement"]
        step, parts, units = measurement["step"], measurement["parts"], capacity["unit_costs"]
        recommendation = capacity["recommendation"]
        fit = recommendation["dense_probes_fit"]
        count = min(fit, args.max_armed) if args.max_armed else fit
        print(
            f"model {model_id} ({identity.get('dtype')}, {identity.get('device')}): "
            f"{step['ms_per_token']:.3f} ms per generated token, {step['ms_per_1k_prompt']:.3f} ms per 1,000 "
            f"prompt tokens"
        )
        print(f"recommendation: {recommendation['explanation']}")
        print(f"unit costs (ms): {units}")
        print(f"measured parts (ms): {parts}")
        if count == 0:
            print("no dense probe fits the budget on this measurement: nothing to arm")
            return
        if count < fit:
            print(f"arming {count} (--max-armed), not all {fit} that fit")
        if count > BACKSTOP:
            print(
                f"PROBE_MAX_ARMED (the backstop, {BACKSTOP}) raised to {count} for this run: the server restarts "
                "on the same data directory, keeping the measurement"
            )
            server.stop()
            server = ServerProcess(data_dir, model=args.model, env={"PROBE_MAX_ARMED": str(count)})
            server.start(600)
        with server.http(timeout=900) as http:
            again = http.get(f"/api/models/{model_id}/probe-capacity").json()
            assert again["stale"] is False and again["recommendation"]["dense_probes_fit"] == fit, again["stale_fields"]
            rng = np.random.default_rng(0)
            vector = [1] + rng.integers(100, 20000, 47).tolist()
            began = time.perf_counter()
            import_dense(http, identity, count, layer, vector)
            imported_s = time.perf_counter() - began
            phase("import")
            began = time.perf_counter()
            dry = http.post(f"/api/probes/behaviours/{BEHAVIOUR}/arm", json={"dry_run": True}).json()
            dry_s = time.perf_counter() - began
            projected = {h: dry["projected_cost"][h]["cost_ms"] for h in ("per_token", "per_1k_prompt")}
            print(
                f"{count} dense probes on layer {layer} imported in {imported_s:.1f} s; dry run in {dry_s:.2f} s: "
                f"would arm {dry['would_arm']}, projected {projected}; the recommendation costed its {fit} at "
                f"{recommendation['dense_cost_ms']}"
            )
            arm_seconds: list[float] = []

            def arm(on: bool) -> None:
                began = time.perf_counter()
                if on:
                    http.post(f"/api/probes/behaviours/{BEHAVIOUR}/arm", json={}).raise_for_status()
                    arm_seconds.append(time.perf_counter() - began)
                else:
                    http.post(f"/api/probes/behaviours/{BEHAVIOUR}/disarm").raise_for_status()

            words = "The harbour was quiet before the storm, and the boats rocked at their moorings. "
            long_chat = [{"role": "user", "content": words * max(1, args.prompt_tokens // 17)}]
            stream_body = {
                "model": model_id,
                "temperature": 0,
                "max_tokens": args.gen_tokens,
                "messages": [{"role": "user", "content": "Tell me about the harbour."}],
            }
            request_body = {"model": model_id, "temperature": 0, "max_tokens": args.gen_tokens, "messages": long_chat}
            for on in (False, True):  # warm both paths once
                arm(on)
                chat_interval(http, stream_body)
                chat_request(http, request_body)
            token: dict[bool, list[float]] = {False: [], True: []}
            request: dict[bool, list[float]] = {False: [], True: []}
            request_cpu: dict[bool, list[float]] = {False: [], True: []}  # server CPU per request
            reports: list[dict] = []
            prompt_tokens = 0
            for round_ in range(args.runs):
                for on in (False, True) if round_ % 2 == 0 else (True, False):
                    arm(on)
                    token[on].append(chat_interval(http, stream_body))
                    cpu = server_cpu(server)
                    elapsed, prompt_tokens = chat_request(http, request_body)
                    request_cpu[on].append(server_cpu(server) - cpu)
                    request[on].append(elapsed)
                    if on:
                        reports.append(http.get("/api/probes/status").json()["last_request"])
            armed = http.get("/api/probes/status").json()
            armed_cost, armed_count = armed["cost"], len(armed["armed"])
            arm(False)
        phase("live rounds")
    finally:
        server.stop()

    median = statistics.median
    per_token = armed_cost["per_token"]
    print(f"\n{armed_count} dense probes armed (one call, every gate): arming took median {median(arm_seconds):.2f} s")

    # per generated token
    paired = median(a - b for a, b in zip(token[True], token[False], strict=True)) * 1000
    off = median(token[False]) * 1000
    print(
        f"per generated token (streamed chat): unarmed {off:.3f} ms, armed {median(token[True]) * 1000:.3f} ms; "
        f"median paired difference {paired:+.4f} ms ({paired / off * 100:+.2f} %) against a per-token budget of "
        f"{per_token['budget_ms']:.4f} ms ({per_token['source']}; costed {per_token['cost_ms']:.4f} ms): "
        f"{'within' if paired <= per_token['budget_ms'] else 'OVER'} the budget"
    )

    # per request: a chat of ~prompt_tokens and gen_tokens
    passes = median(r["forward_passes"] for r in reports)
    gen = passes - 1
    own = step["ms_per_1k_prompt"] * prompt_tokens / 1000 + gen * step["ms_per_token"]
    budget = capacity["budget"]["slowdown_budget_pct"] / 100 * own
    ut, u1k = units["per_token"], units["per_1k_prompt"]
    points = median(r["hooked_points"] for r in reports)
    results = median(r["results"] for r in reports)
    costed_total = (
        points * (u1k["layer"] * prompt_tokens / 1000 + ut["layer"] * gen)
        + armed_count * (u1k["mean"] * prompt_tokens / 1000 + ut["mean"] * gen)
        + u1k["request"]
        + results * u1k["result"]
    )
    paired_request = median(a - b for a, b in zip(request[True], request[False], strict=True)) * 1000
    print(
        f"per request (chat, {prompt_tokens} prompt tokens, {gen:g} generated): unarmed "
        f"{median(request[False]) * 1000:.1f} ms, armed {median(request[True]) * 1000:.1f} ms; median paired "
        f"difference {paired_request:+.2f} ms against a budget of {budget:.2f} ms (5 % of the model's own "
        f"{own:.1f} ms; costed {costed_total:.2f} ms): {'within' if paired_request <= budget else 'OVER'} the budget"
    )
    paired_request_cpu = median(a - b for a, b in zip(request_cpu[True], request_cpu[False], strict=True)) * 1000
    print(
        f"  the server's CPU per request (every thread): unarmed {median(request_cpu[False]) * 1000:.1f} ms, armed "
        f"{median(request_cpu[True]) * 1000:.1f} ms; median paired difference {paired_request_cpu:+.2f} ms: "
        f"{'within' if paired_request_cpu <= budget else 'OVER'} the budget"
    )

    # the cost model against the server's own figures, on the clock measure priced it in
    cpu = "CPU" in parts.get("clock", "")
    suffix = "_cpu_ms" if cpu else "_ms"
    positions = median(r["positions"] for r in reports)
    # the server's own figure ends before the host renders the body: the costed rendering is left out of it
    own_result = u1k["result"] - parts.get("render_ms_per_result", 0.0)
    costed_request = u1k["request"] + results * own_result + armed_count * u1k["mean"] * positions / 1000
    hooks, prompt_hooks = f"hooks{suffix}", f"hooks_prompt{suffix}"
    decode_hooks = median((r[hooks] - r[prompt_hooks]) / max(1, r["forward_passes"] - 1) for r in reports)
    print(
        f"the cost model against the server's own figures (last_request, {parts.get('clock', 'wall')} as measure "
        f"timed them; median of {len(reports)} armed requests of {results:g} results, {positions:g} positions, "
        f"{points:g} hooked point(s), {median(r['device_to_host_copies'] for r in reports):g} device-to-host copy):"
    )
    print(
        ratio_line(
            f"a request's own work (request{suffix})", median(r[f"request{suffix}"] for r in reports), costed_request
        )
    )
    print(
        f"    wall {median(r['request_ms'] for r in reports):.3f} ms; by part (wall): "
        + ", ".join(
            f"{k[:-3]} {median(r[k] for r in reports):.3f} ms"
            for k in ("session_ms", "setup_ms", "scoring_ms", "recording_ms")
        )
    )
    print(
        ratio_line("read hooks per generated token's pass", decode_hooks, points * parts["hook_callback_ms_per_pass"])
    )
    print(
        ratio_line(
            f"read hooks, the prompt's pass ({prompt_tokens} tokens)",
            median(r[prompt_hooks] for r in reports),
            points * parts["hook_callback_ms_per_1k_prompt"] * prompt_tokens / 1000,
        )
    )
    print(
        f"  not in the server's figure: the results rendered into the body, costed "
        f"{parts.get('render_ms_per_result', 0.0) * results:.3f} ms ({parts.get('render_ms_per_result', 0.0):.5f} "
        "ms a result), in the server's CPU per request above"
    )
    print(
        f"  the rest of a hooked point's path (torch's dispatch, the engine's wrapper), not seen inside the "
        f"callbacks, costed {parts['hook_dispatch_ms_per_pass']:.4f} ms per pass"
    )
    print(
        "phases: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in phases)
        + f"; in all {sum(s for _, s in phases):.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--layer", type=int, default=10)
    parser.add_argument("--max-armed", type=int, default=None, help="arm at most this many (default: all that fit)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
