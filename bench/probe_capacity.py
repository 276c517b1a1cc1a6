"""Probe capacity: measure the model, arm as many dense probes as fit in 5 %, and check the live overhead.

One server. POST /api/models/{id}/probe-capacity/measure times the model's own step
and the probes' unit costs, and the recommendation says how many dense probes fit
in the 5 % budget. That many dense probes (one layer, one behaviour) are armed in one
call, through every gate (the cost gate included), and the live per-token overhead is then
measured in the same run: the median interval between streamed tokens with the set
armed against none, interleaved rounds (the order alternates), median of the
per-round paired differences. It should stay within the per-token budget.

    OMP_NUM_THREADS=1 python bench/probe_capacity.py [--model PATH] [--runs 7] [--gen-tokens 64] [--layer 10]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
from pathlib import Path

import numpy as np

from millm_host.testing.server import ServerProcess

_spec = importlib.util.spec_from_file_location("probe_overhead", Path(__file__).with_name("probe_overhead.py"))
assert _spec is not None and _spec.loader is not None
overhead = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(overhead)


BEHAVIOUR = "bench-dense"


def import_dense(http, identity: dict, count: int, layer: int, vector_ids: list[int]) -> list[str]:
    """``count`` dense (mean) probes on one layer, one behaviour, each with a test vector scored here."""
    ids = []
    for i in range(count):
        name = f"bench-dense-{i}"
        draft = overhead.definition(identity, f"{name}-draft", layer, "mean", i, [])
        draft_id = http.post("/api/probes/import", json=draft).json()["id"]
        scored = http.post(
            "/api/probes/score",
            json={"probe_ids": [draft_id], "windows": ["all"], "inputs": [{"token_ids": vector_ids}]},
        ).json()
        http.delete(f"/api/probes/{draft_id}")
        vectors = [{"token_ids": vector_ids, "score": scored["results"][0]["results"][0]["score"]}]
        doc = {**overhead.definition(identity, name, layer, "mean", i, vectors), "behaviour": BEHAVIOUR}
        response = http.post("/api/probes/import", json=doc)
        response.raise_for_status()
        ids.append(response.json()["id"])
    return ids


def run(args: argparse.Namespace) -> None:
    env = {"PROBE_MAX_ARMED": str(args.max_armed)}
    server = ServerProcess(tempfile.mkdtemp(prefix="millm-bench-"), model=args.model, env=env)
    server.start(600)
    try:
        with server.http(timeout=600) as http:
            model_id = http.get("/api/health").json()["model"]
            identity = http.get(f"/api/models/{model_id}").json()
            layer = min(args.layer, identity["n_layers"] - 2)
            capacity = http.post(f"/api/models/{model_id}/probe-capacity/measure")
            capacity.raise_for_status()
            capacity = capacity.json()
            step = capacity["measurement"]["step"]
            recommendation = capacity["recommendation"]
            fit = min(recommendation["dense_probes_fit"], args.max_armed)
            print(
                f"model {model_id} ({identity.get('dtype')}, {identity.get('device')}): "
                f"{step['ms_per_token']:.3f} ms per generated token, {step['ms_per_1k_prompt']:.3f} ms per 1,000 "
                f"prompt tokens"
            )
            print(f"recommendation: {recommendation['explanation']}")
            print(f"unit costs (ms): {capacity['unit_costs']}")
            rng = np.random.default_rng(0)
            vector = [1] + rng.integers(100, 20000, 47).tolist()
            if fit == 0:
                print("no dense probe fits the budget on this measurement: nothing to arm")
                return
            if fit < recommendation["dense_probes_fit"]:
                print(f"arming {fit} (--max-armed), not all {recommendation['dense_probes_fit']} that fit")
            import_dense(http, identity, fit, layer, vector)
            base = {"model": model_id, "temperature": 0, "prompt": vector[:16], "max_tokens": args.gen_tokens}

            dry = http.post(f"/api/probes/behaviours/{BEHAVIOUR}/arm", json={"dry_run": True}).json()
            print(
                f"dry run of the {fit} probes: would arm {dry['would_arm']}; projected per token "
                f"{dry['projected_cost']['per_token']['cost_ms']:.4f} ms, per 1,000 prompt tokens "
                f"{dry['projected_cost']['per_1k_prompt']['cost_ms']:.4f} ms; the recommendation costed its "
                f"{recommendation['dense_probes_fit']} at {recommendation['dense_cost_ms']}"
            )

            def arm(on: bool) -> None:
                if on:
                    http.post(f"/api/probes/behaviours/{BEHAVIOUR}/arm", json={}).raise_for_status()
                else:
                    http.post(f"/api/probes/behaviours/{BEHAVIOUR}/disarm").raise_for_status()

            for on in (False, True):
                arm(on)
                overhead.token_interval(http, base)
            token: dict[bool, list[float]] = {False: [], True: []}
            reports: list[dict] = []
            for round_ in range(args.runs):
                for on in (False, True) if round_ % 2 == 0 else (True, False):
                    arm(on)
                    interval, _ = overhead.token_interval(http, base)
                    token[on].append(interval)
                    if on:
                        reports.append(http.get("/api/probes/status").json()["last_request"])
            armed_cost = http.get("/api/probes/status").json()["cost"]
            units = http.get(f"/api/models/{model_id}/probe-capacity").json()["unit_costs"]
            arm(False)
    finally:
        server.stop()

    median = statistics.median
    paired = median(a - b for a, b in zip(token[True], token[False], strict=True)) * 1000
    budget = armed_cost["per_token"]
    print(
        f"{fit} dense probes armed on layer {layer}: per generated token unarmed {median(token[False]) * 1000:.3f} ms, "
        f"armed {median(token[True]) * 1000:.3f} ms; median paired difference {paired:+.4f} ms "
        f"({paired / (median(token[False]) * 1000) * 100:+.2f} %)"
    )
    print(
        f"live per-token overhead {paired:+.4f} ms against a per-token budget of {budget['budget_ms']:.4f} ms "
        f"({budget['source']}; costed {budget['cost_ms']:.4f} ms, fillable {budget['fillable_ms']:.4f} ms): "
        f"{'within' if paired <= budget['budget_ms'] else 'OVER'} the budget"
    )
    passes = median(r["forward_passes"] for r in reports)
    hooks = median(r["hooks_ms"] / max(1, r["forward_passes"]) for r in reports)
    per_request = median(r["overhead_ms"] - r["hooks_ms"] for r in reports)
    costed_request = units["per_1k_prompt"]["request"] + fit * units["per_1k_prompt"]["result"]
    costed_pass = units["per_token"]["layer"] + fit * units["per_token"]["mean"]
    print(
        f"server's own, per request of {passes:g} passes: read hooks {hooks:.4f} ms per pass (inside the callbacks; "
        f"costed per pass, the real hook path and the probes' scoring share: {costed_pass:.4f} ms); set-up, scoring "
        f"and recording {per_request:.3f} ms per request (costed per request and per result, on the prompt half: "
        f"{costed_request:.3f} ms); in all {median(r['overhead_ms'] for r in reports) / passes:.4f} ms per pass"
    )
    print(
        "  per request, medians: "
        + ", ".join(
            f"{k[:-3]} {median(r[k] for r in reports):.3f} ms" for k in ("setup_ms", "scoring_ms", "recording_ms")
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--layer", type=int, default=10)
    parser.add_argument("--max-armed", type=int, default=64)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
