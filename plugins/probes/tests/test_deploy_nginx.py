"""The shipped nginx example (docs/deploy/nginx.conf) passes a monitored reply whose verdict header is at its cap.

A real nginx (Debian's ``nginx``; skipped when it is not installed) runs the shipped
configuration with its upstreams pointed at the probes' server and its port moved;
every other line is as shipped. Without the example's buffer lines, the same reply
is nginx's 502: the test proves the lines are what carries it.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from millm_host.api import serialize_list
from millm_probes.serving import header

CONFIG = Path(__file__).resolve().parents[3] / "docs" / "deploy" / "nginx.conf"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
CHAT = [{"role": "user", "content": "Tell me about the sea."}]
CAP = 8192  # PROBE_VERDICT_HEADER_MAX_BYTES's default, the largest header the example is sized for

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def config_for(upstream: str, port: int, *, buffers: bool = True) -> str:
    """The shipped configuration with its upstream servers and its port replaced (and, to show what they do,
    its proxy buffer lines left out)."""
    text = CONFIG.read_text()
    servers = re.findall(r"^\s*server\s+[\w.-]+:\d+.*;$", text, flags=re.M)
    assert len(servers) == 2, servers
    text = text.replace(servers[0], f"    server {upstream};").replace(servers[1], "")
    text = re.sub(r"listen\s+\d+;", f"listen 127.0.0.1:{port};", text)
    if not buffers:
        text = re.sub(r"^\s*proxy_buffers?(_size)?\s.*;$", "", text, flags=re.M)
    return text


class Nginx:
    def __init__(self, folder: Path, config: str, port: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "nginx.conf").write_text(config)
        self.url = f"http://127.0.0.1:{port}"
        self.log = folder / "error.log"
        globals_ = f"daemon off; pid {folder / 'nginx.pid'}; error_log {self.log};"
        self.proc = subprocess.Popen(
            [NGINX, "-p", str(folder), "-c", str(folder / "nginx.conf"), "-g", globals_],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                assert self.proc.poll() is None, self.proc.stderr.read().decode() if self.proc.stderr else ""
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def nginx(tmp_path, probes_server):
    started: list[Nginx] = []
    upstream = probes_server.base_url.removeprefix("http://")

    def start(name: str, **options) -> Nginx:
        port = free_port()
        server = Nginx(tmp_path / name, config_for(upstream, port, **options), port)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def rule_set(names: list[str]) -> dict:
    """A rule set whose expressions never fire (so each rule member's size is known before it is served)."""
    return {
        "format": "mi.ruleset/v1",
        "ruleset_id": "nginx-cap",
        "version": "1",
        "signals": {"never": {"kind": "pattern", "pattern": "zqzqzqzq"}},
        "expressions": {name: {"signal": "never"} for name in names},
        "cases": [{"text": "nothing here", "expect": {names[0]: False}}],
    }


def member_size(name: str) -> int:
    """Bytes a rule member adds to the header (with its ", ")."""
    result = {"kind": "rule", "name": name, "fires": False, "count": 0, "window": "prompt", "behaviour": "cap"}
    return len(serialize_list([header.member(result)])) + 2


def names_filling(room: int) -> list[str]:
    """Expression names whose members fill exactly ``room`` bytes."""
    names = []
    while room - member_size(f"e{len(names):03d}") >= 2 * member_size("e000"):
        names.append(f"e{len(names):03d}")
        room -= member_size(names[-1])
    pad = room - member_size(f"e{len(names):03d}")  # the last name takes what is left
    names.append(f"e{len(names):03d}" + "x" * pad)
    assert member_size(names[-1]) == room
    return names


def test_a_reply_with_a_verdict_header_at_its_cap_passes_the_shipped_nginx(
    api, lab, identity, model_id, helpers, nginx
):
    doc = lab.definition(identity, name="cap-watch", behaviour="cap", windows=["prompt"], vectors=1)
    helpers.arm(api, helpers.import_probe(api, doc)["id"])
    body = {"model": model_id, "messages": CHAT, "max_tokens": 2, "temperature": 0}
    alone = api.post("/v1/chat/completions", json=body).headers["x-millm-probe-verdicts"]
    imported = api.post("/api/rule-sets/import", json=rule_set(names_filling(CAP - len(alone))))
    assert imported.status_code == 201, imported.text
    rule_set_id = imported.json()["id"]
    try:
        attached = api.put("/api/probes/behaviours/cap/rule-signals", json={"rule_set_id": rule_set_id})
        assert attached.status_code == 200, attached.text
        direct = api.post("/v1/chat/completions", json=body)
        verdicts = direct.headers["x-millm-probe-verdicts"]
        assert len(verdicts) == CAP and "truncated" not in verdicts  # the largest header the cap lets out

        shipped = nginx("shipped")
        with httpx.Client(base_url=shipped.url, timeout=60) as client:
            through = client.post("/v1/chat/completions", json=body)
        assert through.status_code == 200, (through.text, shipped.log.read_text())
        assert len(through.headers["x-millm-probe-verdicts"]) == CAP

        default = nginx("default-buffers", buffers=False)
        with httpx.Client(base_url=default.url, timeout=60) as client:
            refused = client.post("/v1/chat/completions", json=body)
        assert refused.status_code == 502  # nginx's own header buffer: what the example's lines let through
        assert "too big header" in default.log.read_text()
    finally:
        api.delete("/api/probes/behaviours/cap/rule-signals")
        api.delete(f"/api/rule-sets/{rule_set_id}")
