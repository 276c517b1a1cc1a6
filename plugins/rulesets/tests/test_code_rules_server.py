"""Operator code against one real ``millm serve``: the runner is a child of the server, hostile code is stopped
with its code, a killed runner is restarted, and the server keeps answering chats throughout."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

LOOP = '(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result i32) (loop (br 0)) (i32.const 0)))'
#: The spec's hostile modules, each with the code the runner stops it with.
HOSTILE = {
    "infinite_loop": (LOOP, "rule_resource_limit"),
    "memory_bomb": (
        '(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result i32) '
        "(loop (br_if 0 (i32.ne (memory.grow (i32.const 1)) (i32.const -1)))) (i32.const 0)))",
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
    "oversized_output": (
        '(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result i32) '
        "(i32.const 2147483647)))",
        "rule_output_invalid",
    ),
}
LENGTH = '(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result i32) (local.get 1)))'


def code_set(ruleset_id: str, wat: str) -> dict:
    return {
        "format": "mi.ruleset/v1",
        "ruleset_id": ruleset_id,
        "version": "1",
        "signals": {"custom": {"kind": "code_rule", "wat": wat}},
        "expressions": {"n": "custom"},
        "cases": [{"text": "abc", "expect": {"n": 3}}] if wat == LENGTH else [],
    }


def runner(http, other_than: int | None = None) -> dict:
    for _ in range(600):  # bounded wait for a (re)started runner
        status = http.get("/api/rule-runner").json()
        if status["running"] and status["pid"] != other_than:
            return status
        time.sleep(0.05)
    raise AssertionError(f"no rule runner: {status}")


def evaluate(http, rule_set_id: str, text: str) -> dict:
    r = http.post(f"/api/rule-sets/{rule_set_id}/evaluate", json={"text": text})
    assert r.status_code == 200, r.text
    return r.json()["results"][0]


def test_operator_code_on_a_real_server(server_factory, tiny_model_dir, rulesets_env):
    server = server_factory(tiny_model_dir, env=rulesets_env({"RULE_CODE_FUEL": "2000000"}))
    client = server.openai()

    def chat() -> None:
        reply = client.chat.completions.create(
            model=server.model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.choices[0].message.content is not None

    with server.http() as http:
        length = http.post("/api/rule-sets/import", json=code_set("length", LENGTH))
        assert length.status_code == 201, length.text  # its case ran in the runner
        first = runner(http)
        stat = Path(f"/proc/{first['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[1]) == server.proc.pid  # a child of the server, not the server itself
        assert evaluate(http, length.json()["id"], "héllo")["count"] == 6  # UTF-8 bytes
        for name, (wat, code) in HOSTILE.items():
            hostile = http.post("/api/rule-sets/import", json=code_set(name.replace("_", "-"), wat))
            assert hostile.status_code == 201, hostile.text  # no cases: nothing runs it until asked
            stopped = evaluate(http, hostile.json()["id"], "x")
            assert (name, stopped["reason"], stopped["outcome"]) == (name, code, "failed")
            assert (stopped["status"], stopped["fires"], stopped["count"]) == ("unavailable", None, 0)
            chat()  # the server keeps serving
            assert runner(http)["pid"] == first["pid"], name  # and the runner survived it (no restart needed)
        os.kill(first["pid"], signal.SIGKILL)
        restarted = runner(http, first["pid"])
        assert restarted["starts"] >= 2
        chat()
        assert evaluate(http, length.json()["id"], "abcd")["count"] == 4
