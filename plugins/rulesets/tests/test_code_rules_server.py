"""Operator code against one real ``millm serve``: the runner is a child of the server, hostile code is stopped
with its code, a killed runner is restarted, and the server keeps answering chats throughout."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

LOOP = '(module (memory (export "memory") 1) (func (export "count") (param i32 i32) (result i32) (loop (br 0)) (i32.const 0)))'
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
        loop = http.post("/api/rule-sets/import", json=code_set("loop", LOOP)).json()["id"]
        stopped = evaluate(http, loop, "x")
        assert (stopped["reason"], stopped["fires"]) == ("rule_resource_limit", None)
        chat()
        assert runner(http)["pid"] == first["pid"]  # hostile code did not take the runner down
        os.kill(first["pid"], signal.SIGKILL)
        restarted = runner(http, first["pid"])
        assert restarted["starts"] >= 2
        chat()
        assert evaluate(http, length.json()["id"], "abcd")["count"] == 4
