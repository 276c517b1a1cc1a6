"""Operator code (code_rule): scored by the wasmtime rule runner, a sidecar process the server supervises.

Hostile modules (an infinite loop, a memory bomb, deep recursion, an import the
runner does not offer, oversized output) are each stopped with their own code, the
server keeps serving and the runner stays up; a runner that is killed is restarted,
and one that does not answer leaves rule_worker_unavailable.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

#: count(ptr, len): the number of "a" bytes in the text.
COUNT_A = """(module (memory (export "memory") 1)
  (func (export "count") (param $p i32) (param $n i32) (result i32) (local $c i32)
    (block $done (loop $next
      (br_if $done (i32.eqz (local.get $n)))
      (if (i32.eq (i32.load8_u (local.get $p)) (i32.const 97))
        (then (local.set $c (i32.add (local.get $c) (i32.const 1)))))
      (local.set $p (i32.add (local.get $p) (i32.const 1)))
      (local.set $n (i32.sub (local.get $n) (i32.const 1)))
      (br $next)))
    (local.get $c)))"""


def body(code: str) -> str:
    return f'(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result i32) {code}))'


HOSTILE = {
    "infinite_loop": (body("(loop (br 0)) (i32.const 0)"), "rule_resource_limit"),
    "memory_bomb": (
        body("(loop (br_if 0 (i32.ne (memory.grow (i32.const 1)) (i32.const -1)))) (i32.const 0)"),
        "rule_resource_limit",
    ),
    "huge_memory": (
        '(module (memory (export "memory") 60000) (func (export "count") (param i32 i32) (result i32) (i32.const 0)))',
        "rule_resource_limit",
    ),
    "deep_recursion": (
        '(module (memory (export "memory") 1) (func $f (export "count") (param i32 i32) (result i32) '
        "(call $f (local.get 0) (local.get 1))))",
        "rule_resource_limit",
    ),
    "host_import": (
        '(module (import "env" "read_file" (func $r (param i32) (result i32))) (memory (export "memory") 1) '
        '(func (export "count") (param i32 i32) (result i32) (call $r (i32.const 0))))',
        "rule_load_refused",
    ),
    "oversized_output": (body("(i32.const 2147483647)"), "rule_output_invalid"),
    "negative_output": (body("(i32.const -1)"), "rule_output_invalid"),
    "not_an_i32": (
        '(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result f64) (f64.const 1.5)))',
        "rule_output_invalid",
    ),
    "trap": (body("unreachable"), "rule_error"),
    "not_wat": ("(module (func", "rule_load_refused"),
}


def code_set(ruleset_id: str, wat: str, cases: list | None = None, **more: dict) -> dict:
    return {
        "format": "mi.ruleset/v1",
        "ruleset_id": ruleset_id,
        "version": "1",
        "signals": {"email": {"kind": "pattern", "pattern": r"\S+@\S+"}, "custom": {"kind": "code_rule", "wat": wat}},
        "expressions": {"as": "custom", "either": {"any": ["custom", "email"]}, "email_only": "email"},
        "outputs": [{"column": "n", "use": "count", "of": "custom"}],
        "cases": cases or [],
        **more,
    }


@pytest.fixture(scope="module")
def app(app_factory, rulesets_env):
    # little fuel, a long wall time: the infinite loop runs out of fuel well before its wall time, even on a busy box
    return app_factory(
        plugins=["rulesets"], env=rulesets_env({"RULE_CODE_FUEL": "2000000", "RULE_CODE_CALL_WALL_MS": "1000"})
    )


@pytest.fixture
def http(app):
    with app.http() as client:
        yield client
        for s in client.get("/api/rule-sets").json()["data"]:
            client.delete(f"/api/rule-sets/{s['id']}")


def evaluate(http, rule_set_id: str, text: str, **extra) -> dict:
    r = http.post(f"/api/rule-sets/{rule_set_id}/evaluate", json={"text": text, **extra})
    assert r.status_code == 200, r.text
    return {x["name"]: x for x in r.json()["results"]}


def imported(http, doc: dict) -> str:
    r = http.post("/api/rule-sets/import", json=doc)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def wait_for_runner(http, other_than: int | None) -> dict:
    """The runner's status once a runner other than ``other_than`` is running (bounded wait)."""
    for _ in range(600):
        status = http.get("/api/rule-runner").json()
        if status["running"] and status["pid"] != other_than:
            return status
        time.sleep(0.05)
    raise AssertionError(f"the rule runner was not restarted: {status}")


def test_a_code_rule_is_counted_by_the_runner_and_its_cases_must_pass(http):
    cases = [{"text": "banana", "expect": {"as": 3, "either": True}}, {"text": "xyz", "expect": {"as": False}}]
    assert http.post("/api/rule-sets/validate", json=code_set("a", COUNT_A, cases)).json()["valid"] is True
    rule_set_id = imported(http, code_set("a", COUNT_A, cases))
    got = evaluate(http, rule_set_id, "a banana, mail a@b.example")
    assert got["as"]["fires"] is True and got["as"]["count"] == 7 and got["as"]["status"] == "final"
    assert got["either"]["count"] == 8 and got["email_only"]["count"] == 1
    spans = evaluate(http, rule_set_id, "banana", return_rule_positions=True)
    assert spans["as"]["count"] == 3 and spans["as"]["spans"] is None  # operator code has no positions
    wrong = code_set("b", COUNT_A, [{"text": "banana", "expect": {"as": 2}}])
    r = http.post("/api/rule-sets/import", json=wrong)
    assert r.status_code == 400 and r.json()["error"]["code"] == "rule_set_cases_failed"
    assert r.json()["error"]["failures"][0]["got"] == {"fires": True, "count": 3}
    failing = code_set("c", HOSTILE["trap"][0], [{"text": "banana", "expect": {"as": 0}}])
    r = http.post("/api/rule-sets/validate", json=failing)
    assert r.status_code == 400 and r.json()["error"]["failures"][0]["got"] == {"reason": "rule_error"}
    assert [s["ruleset_id"] for s in http.get("/api/rule-sets").json()["data"]] == ["a"]


def test_what_needs_a_code_rules_positions_is_still_refused(http):
    near = code_set("w", COUNT_A, expressions={"near": {"within_n": {"a": "custom", "b": "email", "n": 5}}})
    error = http.post("/api/rule-sets/import", json=near).json()["error"]
    assert error["code"] == "code_rule_in_within_n" and error["expression"] == "near"
    field = code_set("f", COUNT_A, outputs=[{"column": "text", "use": "field", "of": "either"}])
    error = http.post("/api/rule-sets/validate", json=field).json()["error"]
    assert error["code"] == "code_rule_positions_needed" and error["column"] == "text"


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_code_is_stopped_with_its_code_and_the_server_keeps_serving(http, name):
    wat, code = HOSTILE[name]
    before = wait_for_runner(http, None)["pid"]
    rule_set_id = imported(http, code_set(name, wat))
    got = evaluate(http, rule_set_id, "banana a@b.example")
    for expression in ("as", "either"):  # either reads the code rule, so it is undecided too
        result = got[expression]
        assert (result["reason"], result["outcome"], result["status"]) == (code, "failed", "unavailable")
        assert result["fires"] is None and result["count"] == 0
    assert got["email_only"]["fires"] is True  # what does not read operator code is decided
    assert http.get("/api/health").status_code == 200
    assert http.get("/api/rule-runner").json()["pid"] == before  # the runner survived it


def test_a_killed_runner_is_restarted(http):
    rule_set_id = imported(http, code_set("k", COUNT_A))
    assert evaluate(http, rule_set_id, "banana")["as"]["count"] == 3
    pid = wait_for_runner(http, None)["pid"]
    os.kill(pid, signal.SIGKILL)
    restarted = wait_for_runner(http, pid)
    assert restarted["starts"] >= 2
    assert evaluate(http, rule_set_id, "banana")["as"]["count"] == 3


def test_a_runner_that_does_not_answer_leaves_rule_worker_unavailable_and_is_replaced(http):
    rule_set_id = imported(http, code_set("s", COUNT_A))
    pid = wait_for_runner(http, None)["pid"]
    os.kill(pid, signal.SIGSTOP)  # alive, but it answers nothing
    try:
        got = evaluate(http, rule_set_id, "banana")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass  # already killed by the server, as it should be
    assert got["as"]["reason"] == "rule_worker_unavailable" and got["as"]["outcome"] == "skipped"
    wait_for_runner(http, pid)
    assert evaluate(http, rule_set_id, "banana")["as"]["count"] == 3


def test_wall_time_input_size_and_calls_per_request(app_factory, rulesets_env):
    app = app_factory(
        plugins=["rulesets"],
        env=rulesets_env(
            {
                "RULE_CODE_FUEL": str(10**15),  # so the wall time, not the fuel, stops the loop
                "RULE_CODE_CALL_WALL_MS": "50",
                "RULE_CODE_MAX_INPUT_BYTES": "100",
                "RULE_CODE_CALLS_PER_REQUEST": "1",
            }
        ),
    )
    with app.http() as http:
        looping = imported(http, code_set("loop", HOSTILE["infinite_loop"][0]))
        assert evaluate(http, looping, "banana")["as"]["reason"] == "rule_timeout"
        counting = imported(http, code_set("count", COUNT_A))
        assert evaluate(http, counting, "x" * 101)["as"]["reason"] == "rule_input_too_large"
        two = code_set("two", COUNT_A)
        two["signals"]["second"] = {"kind": "code_rule", "wat": COUNT_A.replace("97", "98")}
        two["expressions"]["bs"] = "second"
        got = evaluate(http, imported(http, two), "banana")
        assert got["as"]["count"] == 3  # the request's one call
        assert got["bs"]["reason"] == "rule_worker_unavailable" and got["bs"]["outcome"] == "skipped"


def test_code_rule_cases_are_re_proved_by_the_runner_at_start(app_factory, rulesets_env):
    app = app_factory(plugins=["rulesets"], env=rulesets_env())
    with app.http() as http:
        rule_set_id = imported(http, code_set("proved", COUNT_A, [{"text": "banana", "expect": {"as": 3}}]))
    app.stop()
    app.start()  # startup re-proves the stored set: its case asks a fresh runner
    with app.http() as http:
        assert http.get(f"/api/rule-sets/{rule_set_id}").json()["status"] == "published"
        assert evaluate(http, rule_set_id, "banana")["as"]["count"] == 3
