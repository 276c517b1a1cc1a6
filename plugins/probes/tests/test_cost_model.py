"""An app of its own, in-process: the cost model (probe-monitors.txt, "Probe limits per model").

The recommendation, a dry run and arming cost a set by one function, so the dense probes the
recommendation says fit are exactly the ones arming accepts; and a budget approved before
2026-10-29 (decision D83) is not in force. Measurements and approvals are seeded through the
server's database, so the counts are exact on any machine.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from millm_host.testing import assert_error, databases

#: Unit costs (ms) whose recommendation is three dense probes on one layer, bound by the prompt half
#: (the per-request and per-result parts): 0.5 + 1.0 + n * (0.5 + 0.5) <= 0.9 * 5 % of 100 ms.
UNITS = {
    "per_token": {
        "layer": 0.1,
        "mean": 0.05,
        "max": 0.05,
        "attention": 0.1,
        "sparse": 0.25,
        "request": 0.0,
        "result": 0.0,
    },
    "per_1k_prompt": {
        "layer": 0.5,
        "mean": 0.5,
        "max": 0.5,
        "attention": 1.0,
        "sparse": 2.5,
        "request": 1.0,
        "result": 0.5,
    },
}
STEP = {"ms_per_token": 10.0, "ms_per_1k_prompt": 100.0}


@pytest.fixture(scope="module")
def server(probe_app):
    return probe_app()


@pytest.fixture(scope="module")
def model_id(server):
    return server.model_id


@pytest.fixture(scope="module")
def measured(server, model_id):
    """One real measurement (it times the real hook path), kept for the module."""
    with server.http(timeout=600) as http:
        response = http.post(f"/api/models/{model_id}/probe-capacity/measure")
        assert response.status_code == 200, response.text
        return response.json()


@pytest.fixture
def http(server, model_id):
    with server.http(timeout=300) as client:
        yield client
        for probe in client.get("/api/probes").json()["data"]:
            client.post(f"/api/probes/{probe['id']}/disarm")
            client.delete(f"/api/probes/{probe['id']}")
        client.put(f"/api/models/{model_id}/probe-limits", json={"action": "clear"})


def seed(server, model_id: str, **columns) -> None:
    """Write the model's ``probe_capacity`` columns straight into the server's database (SQLite or PostgreSQL)."""
    engine = sa.create_engine(databases.database_url(server.data_dir))
    try:
        with engine.begin() as db:
            for column, value in columns.items():
                table = sa.table("probe_capacity", sa.column("model_id"), sa.column(column, sa.JSON))
                db.execute(sa.update(table).where(table.c.model_id == model_id).values({column: value}))
    finally:
        engine.dispose()


def test_measure_times_the_real_hook_path_and_per_request_work(http, measured):
    print(json.dumps(measured, indent=1))  # its figures come from timing: shown where an assertion fails
    step, units = measured["measurement"]["step"], measured["unit_costs"]
    assert step["hooked_points"] >= 1 and step["hooked_ms_per_token"] > 0
    parts = measured["measurement"]["parts"]  # what the units were made of, timed on the live path
    assert parts["hook_callback_ms_per_pass"] > 0 and parts["hook_callback_ms_per_1k_prompt"] > 0
    assert parts["request_results"] == 1 and parts["request_many_results"] == 1024
    assert parts["request_ms_many"] > 0 and parts["request_positions"] > 0
    assert units["per_token"]["layer"] > 0 and units["per_1k_prompt"]["layer"] > 0
    assert units["per_1k_prompt"]["request"] > 0 and units["per_1k_prompt"]["result"] > 0
    assert units["per_token"]["request"] == 0 and units["per_token"]["result"] == 0  # charged to the prompt half
    recommendation = measured["recommendation"]
    # The server batches (8 rows at most): a row's share of the step and of the batched read at 2, 4 and 8 rows.
    batch = step["batch"]
    assert set(batch) == {"2", "4", "8"}
    for rows, line in batch.items():
        half = f"per_token_rows_{rows}"
        assert line["ms_per_step"] > 0 and line["ms_per_row_token"] == pytest.approx(
            line["ms_per_step"] / int(rows), abs=1e-6
        )
        assert step[f"ms_{half}"] == pytest.approx(line["ms_per_row_token"], abs=1e-6)
        assert units[half]["layer"] > 0 and units[half]["mean"] == units["per_token"]["mean"]  # its arithmetic: its own
        assert measured["budget"][half]["budget_ms"] == pytest.approx(0.05 * step[f"ms_{half}"])
        assert measured["budget"][half]["batch_rows"] == int(rows)
    assert set(recommendation["dense_cost_ms"]) == {"per_token", "per_1k_prompt"} | {
        f"per_token_rows_{n}" for n in batch
    }
    # the writes it timed left nothing behind
    assert http.get("/api/probes/events").json()["data"] == []
    assert http.get("/api/probes/sessions").json()["data"] == []


def test_the_recommendation_dry_run_and_arming_cost_a_set_alike(http, server, model_id, measured, lab, helpers):
    seed(server, model_id, measurement={**measured["measurement"], "units": UNITS, "step": STEP})
    capacity = http.get(f"/api/models/{model_id}/probe-capacity").json()
    assert capacity["stale"] is False and capacity["budget"]["basis"] == "measured"
    recommendation = capacity["recommendation"]
    fit = recommendation["dense_probes_fit"]
    assert fit == 3 and recommendation["dense_cost_ms"] == {"per_token": 0.25, "per_1k_prompt": 4.5}
    approved = http.put(
        f"/api/models/{model_id}/probe-limits",
        json={"action": "approve", "recommendation_digest": recommendation["digest"]},
    )
    assert approved.status_code == 200, approved.text

    identity = http.get(f"/api/models/{model_id}").json()
    probes = [
        helpers.import_probe(http, lab.definition(identity, name=f"dense-{i}", behaviour="dense", seed=i))
        for i in range(fit + 1)
    ]
    ids = [p["id"] for p in probes]
    dry = http.post("/api/probes/behaviours/dense/arm", json={"dry_run": True, "probe_ids": ids[:fit]}).json()
    assert dry["would_arm"] is True
    projected = {half: dry["projected_cost"][half]["cost_ms"] for half in ("per_token", "per_1k_prompt")}
    assert projected == recommendation["dense_cost_ms"]  # the same set, costed the same way

    over = http.post("/api/probes/behaviours/dense/arm", json={"dry_run": True}).json()
    assert over["would_arm"] is False and [g["gate"] for g in over["set_gates"]] == ["cost"]
    assert over["projected_cost"]["per_1k_prompt"]["fits"] is False and over["projected_cost"]["per_token"]["fits"]

    armed = http.post("/api/probes/behaviours/dense/arm", json={"probe_ids": ids[:fit]})
    assert armed.status_code == 200, armed.text
    cost = http.get("/api/probes/status").json()["cost"]
    assert {half: cost[half]["cost_ms"] for half in ("per_token", "per_1k_prompt")} == projected
    refusal = assert_error(http.post(f"/api/probes/{ids[fit]}/arm", json={}), 409, "PROBE_COST_BUDGET_EXCEEDED")
    assert refusal["gate"] == "cost" and "the budget is measured" in refusal["message"]


@pytest.mark.parametrize(
    ("set_at", "reason"),
    [
        ("2026-10-28T23:59:59+00:00", "before 2026-10-29"),
        ("2026-10-01T09:00:00", "before 2026-10-29"),
        (None, "unknown"),
    ],
)
def test_an_approval_before_d83_is_not_in_force(http, server, model_id, measured, set_at, reason):
    seed(server, model_id, measurement={**measured["measurement"], "units": UNITS, "step": STEP})
    old = {"mode": "approved", "pct": 40.0, "recommendation_digest": "sha256:" + "0" * 64, "set_by": "ops@old"}
    seed(server, model_id, limits=old if set_at is None else {**old, "set_at": set_at})
    capacity = http.get(f"/api/models/{model_id}/probe-capacity").json()
    stored = capacity["stored_limits"]
    assert stored["in_force"] is False and reason in stored["not_in_force_reason"]
    assert "applies until the new recommendation is approved" in stored["not_in_force_reason"]
    pct = capacity["limits"]["slowdown_budget_pct"]
    assert pct == {"value": 5.0, "source": "setting PROBE_SLOWDOWN_BUDGET_PCT", "set_by": None, "set_at": None}
    assert capacity["budget"]["per_token"]["budget_ms"] == pytest.approx(0.5)  # 5 % of 10 ms, not 40 %

    # approving the new recommendation puts a budget back in force, stamped with a timezone
    approved = http.put(
        f"/api/models/{model_id}/probe-limits",
        json={"action": "approve", "recommendation_digest": capacity["recommendation"]["digest"], "set_by": "ops@new"},
    ).json()
    assert approved["stored_limits"]["in_force"] is True and approved["stored_limits"]["not_in_force_reason"] is None
    assert approved["limits"]["slowdown_budget_pct"]["source"] == "approved"
    assert approved["stored_limits"]["set_at"].endswith("Z")


def test_an_approval_after_d83_and_an_old_override_stay_in_force(http, server, model_id, measured):
    seed(server, model_id, measurement={**measured["measurement"], "units": UNITS, "step": STEP})
    seed(server, model_id, limits={"mode": "approved", "pct": 5.0, "set_by": "ops", "set_at": "2026-10-29T00:00:00Z"})
    capacity = http.get(f"/api/models/{model_id}/probe-capacity").json()
    assert capacity["stored_limits"]["in_force"] is True
    assert capacity["limits"]["slowdown_budget_pct"]["source"] == "approved"
    override = {"mode": "override", "pct": 10.0, "set_by": "ops", "set_at": "2026-09-01T00:00:00Z"}
    seed(server, model_id, limits=override)
    capacity = http.get(f"/api/models/{model_id}/probe-capacity").json()
    assert capacity["stored_limits"]["in_force"] is True and capacity["budget"]["per_token"]["budget_ms"] == 1.0


def test_a_measurement_of_another_precision_or_device_is_stale(http, server, model_id, measured, lab, helpers):
    identity = {**measured["measurement"]["identity"], "precision": "bfloat16", "device": "cuda:0"}
    seed(server, model_id, measurement={**measured["measurement"], "identity": identity, "units": UNITS, "step": STEP})
    capacity = http.get(f"/api/models/{model_id}/probe-capacity").json()
    assert capacity["stale"] is True and sorted(capacity["stale_fields"]) == ["device", "precision"]
    assert capacity["fallback"] == {"per_token_ms": 0.25, "per_1k_prompt_ms": 0.5, "why": "measured, but stale"}
    assert capacity["budget"]["basis"] == "fallback (the measurement is stale)"
    assert capacity["limits"]["per_token_ms"]["source"] == "setting PROBE_MAX_OVERHEAD_MS_PER_PASS"
    assert capacity["recommendation"]["dense_probes_fit"] == 3  # still explained, for the measurement it was
    model = http.get(f"/api/models/{model_id}").json()
    probes = [
        helpers.import_probe(http, lab.definition(model, name=f"stale-{i}", behaviour="stale", seed=i))
        for i in range(9)
    ]
    refusal = assert_error(http.post("/api/probes/behaviours/stale/arm", json={}), 409, "PROBE_BEHAVIOUR_REFUSED")
    [cost] = [g for g in refusal["set_gates"] if g["gate"] == "cost"]
    assert "the budget is fallback (the measurement is stale)" in cost["message"]
    assert len(refusal["probes"]) == len(probes)


def test_a_set_must_fit_a_row_of_a_full_batch(http, server, model_id, measured, lab, helpers):
    """In a batch of 8 a row's share of the step is 2 ms (not 10): one dense probe fits there, though seven
    fit a row alone; the recommendation, the gate and status all cost the batch's rows so."""
    units = {**UNITS, "per_token_rows_8": {**UNITS["per_token"], "layer": 0.02}}
    step = {**STEP, "ms_per_token_rows_8": 2.0}
    seed(server, model_id, measurement={**measured["measurement"], "units": units, "step": step})
    capacity = http.get(f"/api/models/{model_id}/probe-capacity").json()
    recommendation = capacity["recommendation"]
    assert recommendation["dense_probes_fit"] == 1 and "2 rows" not in recommendation["explanation"]
    assert "0.1 ms per token at 8 rows" in recommendation["explanation"]
    identity = http.get(f"/api/models/{model_id}").json()
    first, second = (
        helpers.import_probe(http, lab.definition(identity, name=f"row-{i}", behaviour="rows", seed=i))
        for i in range(2)
    )
    assert http.post(f"/api/probes/{first['id']}/arm", json={}).status_code == 200
    refusal = assert_error(http.post(f"/api/probes/{second['id']}/arm", json={}), 409, "PROBE_COST_BUDGET_EXCEEDED")
    assert "per token rows 8 0.12 ms > 0.09 ms" in refusal["message"]
    assert refusal["cost"]["per_token"]["fits"] and not refusal["cost"]["per_token_rows_8"]["fits"]
    cost = http.get("/api/probes/status").json()["cost"]
    # Nothing runs now: a row alone pays 0.15 ms of its 10 ms (1.5 %); one of a batch of 8 would pay 0.07 of 2 (3.5 %).
    assert cost["running_batch"] == {
        "rows": 0,
        "half": "per_token",
        "cost_ms_per_row_token": 0.15,
        "model_ms_per_row_token": 10.0,
        "overhead_pct": 1.5,
    }
    assert cost["per_token_rows_8"]["overhead_pct"] == 3.5
