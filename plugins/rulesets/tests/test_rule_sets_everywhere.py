"""Rule sets are desired state: an import, attach, detach or delete on one process reaches every other.

Two ``millm serve`` replicas on one database, and gunicorn with two workers: a set imported and attached
through one process runs on requests the other serves, within ``MILLM_CONVERGE_INTERVAL_S``; a detach and
a delete reach it too; ``/api/health``'s ``replica.convergers.rulesets`` says whether this process follows.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from millm_host.testing.gunicorn import workers
from millm_host.testing.helpers import post_retrying_busy
from millm_host.testing.replicas import FAST_CONVERGE, shared_database_url, wait_until

BEHAVIOUR = "pii"
CHAT = [{"role": "user", "content": "my card is 4111 1111 1111 1111"}]


def arm_probe(http: httpx.Client, lab) -> None:
    identity = http.get(f"/api/models/{http.get('/api/health').json()['model']}").json()
    probe = http.post("/api/probes/import", json=lab.definition(identity, name="pii-watch", behaviour=BEHAVIOUR))
    assert probe.status_code == 201, probe.text
    assert http.post(f"/api/probes/{probe.json()['id']}/arm", json={}).status_code == 200


def rule_results(base: str, model: str) -> list[dict[str, Any]]:
    reply = post_retrying_busy(base, "/v1/chat/completions", {"model": model, "messages": CHAT, "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    return [r for r in reply.json().get("millm_probe_verdicts", []) if r["kind"] == "rule"]


def sets_on(base: str) -> list[str]:
    return [s["id"] for s in httpx.get(f"{base}/api/rule-sets").json()["data"]]


def test_a_rule_set_changed_on_one_replica_applies_on_the_other(
    replicas_factory, probe_model_dir, lab, docs, rulesets_env, tmp_path
):
    env = rulesets_env({"MILLM_DATABASE_URL": shared_database_url(tmp_path), **FAST_CONVERGE})
    a, b = replicas_factory(2, probe_model_dir, env=env)
    with a.http() as ha, b.http() as hb:
        arm_probe(ha, lab)
        rule_set = ha.post("/api/rule-sets/import", json=docs.PII).json()
        wait_until(lambda: sets_on(b.base_url) == [rule_set["id"]], "B to load the set imported on A")
        # attached on B (which imported nothing itself): A runs it at once, B too
        attached = hb.put(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": rule_set["id"]})
        assert attached.status_code == 200, attached.text
        wait_until(lambda: rule_results(a.base_url, a.model_id), "A to run the set attached on B")
        wait_until(lambda: rule_results(b.base_url, b.model_id), "B to arm the probe armed on A")
        assert {r["rule_set_id"] for r in rule_results(b.base_url, b.model_id)} == {rule_set["id"]}
        health = hb.get("/api/health").json()["replica"]["convergers"]["rulesets"]
        assert health == {"converged": True, "reasons": []}
        # detached and deleted on A: B stops running it, and forgets it
        assert ha.delete(f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals").status_code == 200
        assert ha.delete(f"/api/rule-sets/{rule_set['id']}").status_code == 200
        wait_until(lambda: sets_on(b.base_url) == [], "B to forget the deleted set")
        assert rule_results(b.base_url, b.model_id) == []


def test_gunicorn_workers_run_a_rule_set_imported_through_either(probe_model_dir, lab, docs, rulesets_env, tmp_path):
    with workers(probe_model_dir, tmp_path, count=2, env=rulesets_env(FAST_CONVERGE)) as base:
        with httpx.Client(base_url=base, timeout=60) as http:
            arm_probe(http, lab)
            model = http.get("/api/health").json()["model"]
            rule_set = http.post("/api/rule-sets/import", json=docs.PII).json()
            attached = http.put(
                f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": rule_set["id"]}
            )
            assert attached.status_code == 200, attached.text

        def every_worker_answers() -> list:
            answers: list = [None] * 12
            threads = [
                threading.Thread(target=lambda i=i: answers.__setitem__(i, rule_results(base, model)))
                for i in range(12)
            ]  # at once, on new connections: the kernel spreads them over the workers
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return answers

        # a few convergence passes (0.3 s each); a loaded machine may need more before every worker has run one
        deadline = time.monotonic() + 30
        while not all(every_worker_answers()) and time.monotonic() < deadline:
            time.sleep(0.5)
        answers = every_worker_answers()
        assert all(answer and {r["rule_set_id"] for r in answer} == {rule_set["id"]} for answer in answers), answers
