"""The operator's flows in a real browser against one real server on the default model
(SmolLM2-135M-Instruct, the transformers engine), in order: load the model from the Models page,
import a probe made for it, arm its behaviour through the dialog, see a chat's verdict arrive live,
open the event detail, read the session timeline and transcript, delete the session; rule sets,
steering, clusters and circuits; Browse Hub (a local Hub, ``LocalHub``); a partial set; a restart and
the one-click re-arm.

Names and text the server returns are hostile markup: the page must show them as text (a script that
ran would open a dialog, which fails the test)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from openai import OpenAI

from millm_host.testing.hub import LocalHub

from .conftest import probe_lab

HOSTILE = '<img src=x onerror="alert(1)">'
SESSION = f"ui {HOSTILE}"
PROMPT = f"Tell me about {HOSTILE} please"
BEHAVIOUR = "stakes<b>"
HUB_REPO = "mistudio/high-stakes-probes"
HUB_BEHAVIOUR = "high-stakes"
HUB_TAG = "mistudio-probe-definition"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A local Hugging Face Hub (its repos are written once the model is loaded: they are made for it)."""
    local = LocalHub(tmp_path_factory.mktemp("ui-hub")).start()
    yield local
    local.stop()


@pytest.fixture(scope="module")
def sae_root(tmp_path_factory):
    """Where the server may read SAEs (written for the model once it is loaded)."""
    return tmp_path_factory.mktemp("ui-saes")


@pytest.fixture(scope="module")
def server(server_factory, ui_env, sae_root, hub):
    """The default model, found but not loaded: the first flow loads it from the Models page."""
    env = ui_env(
        MILLM_LOAD_ON_START="false",
        PROBE_TRANSCRIPTS="true",
        MILLM_SAE_DIRS=str(sae_root),
        PROBE_HUB_ENDPOINT=hub.url,
    )
    return server_factory(env=env, wait_for=None)


def api(server) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=120)


@pytest.fixture(scope="module")
def identity(server) -> dict:
    """The resident model's identity (loaded here when a test runs without the first flow)."""
    with api(server) as http:
        model_id = http.get("/api/models").json()["data"][0]["id"]
        if http.get("/api/health").json()["status"] != "ok":
            http.post(f"/api/models/{model_id}/load").raise_for_status()
        return http.get(f"/api/models/{model_id}").json()


@pytest.fixture(scope="module")
def lab(identity, default_checkpoint_dir):
    """The reference on the float32 checkpoint the server converted the bundled GGUF into."""
    return probe_lab(default_checkpoint_dir)


@pytest.fixture(scope="module")
def saes(lab, sae_root):
    """One SAELens directory on layer 1, one on layer 2, for the model's width."""
    lab.make_sae(sae_root, "sae-ui", layer=1, d_sae=96)
    lab.make_sae(sae_root, "sae-ui2", layer=2, d_sae=96, seed=1)
    return sae_root


@pytest.fixture(scope="module")
def hub_repos(hub, lab, identity) -> dict:
    """A tagged repo of four probes of one behaviour; its manifest states the rung of three of them."""
    docs = {
        f"hs-{i}": lab.definition(
            identity, name=f"hs-{i}", behaviour=HUB_BEHAVIOUR, layer=3, rung=2, seed=20 + i, rule=rule
        )
        for i, rule in ((1, "mean"), (2, "max"), (3, "last"), (4, "mean"))
    }
    manifest = {"definitions": [{"filename": f"hs-{i}.probe.json", "rung": 2} for i in (1, 2, 3)]}
    files = {f"{name}.probe.json": json.dumps(doc) for name, doc in docs.items()}
    hub.add_repo(HUB_REPO, {**files, "manifest.json": json.dumps(manifest)}, tags=[HUB_TAG])
    hub.add_repo("acme/other-probes", {"other.probe.json": json.dumps(docs["hs-4"])}, tags=[HUB_TAG])
    hub.add_repo("acme/not-probes", {"weights.bin": b"\0"}, tags=["text-generation"])
    return docs


@pytest.fixture(scope="module")
def state() -> dict:
    return {}


def test_load_the_default_model_from_the_models_page(server, ui_page):
    """The bundled default, on the transformers engine (its cached float32 checkpoint), with its progress."""
    page = ui_page(server)
    page.goto("/ui/models")
    card = page.page.locator("section.model", has_text="SmolLM2-135M-Instruct")
    assert card.locator(".badge").inner_text() == "READY"
    assert "transformers" in card.inner_text()
    page.shot("before-load")
    card.locator("button.load").click()
    # the load progress, read from /api/health while the load runs
    page.page.wait_for_function(
        "document.getElementById('server-status').textContent === 'loading'"
        " && document.getElementById('load-progress').textContent !== ''",
        timeout=60_000,
    )
    page.shot("loading")
    card.locator(".badge.state-loaded").wait_for(timeout=300_000)
    page.page.wait_for_load_state("load")
    assert page.page.locator("#server-status").inner_text() == "ok"
    card = page.page.locator("section.model", has_text="SmolLM2-135M-Instruct")
    assert "30 layers × 576" in card.inner_text() and "float32" in card.inner_text()
    capacity = card.locator("details.capacity")
    assert "Probe capacity" in capacity.inner_text()
    bars = capacity.locator(".bar[role=meter]")
    assert bars.count() == 2 and bars.first.get_attribute("aria-valuenow") == "0"  # nothing armed yet
    assert "Fallback budgets (not measured)" in capacity.inner_text()
    page.shot("loaded")


def test_import_a_probe(server, ui_page, state, lab, identity):
    doc = lab.definition(identity, name=f"mean {HOSTILE}", behaviour=BEHAVIOUR, threshold=-1e9, rung=1, seed=11)
    page = ui_page(server)
    page.goto("/ui/probes")
    page.page.fill("#probe-document", json.dumps(doc))
    page.page.click("#import-probe")
    group = page.settled(page.page.locator(f'section.behaviour[data-behaviour="{BEHAVIOUR}"]'))
    assert group.locator("h2").inner_text().startswith(BEHAVIOUR)  # the markup is text
    assert f"mean {HOSTILE}" in group.inner_text()
    assert "rung 1: detects on held-out data" in group.inner_text()
    assert "0 results · 0 fired" in group.inner_text()
    state["probe_id"] = group.locator("tr[data-probe]").first.get_attribute("data-probe")
    page.shot("imported")


def test_arm_the_behaviour_through_the_dialog(server, ui_page, state):
    page = ui_page(server)
    page.goto("/ui/probes")
    group = page.page.locator(f'section.behaviour[data-behaviour="{BEHAVIOUR}"]')
    group.locator("button[data-dry-run]").click()
    dry = group.locator(".dry-run-result")
    dry.locator("li[data-gate=evidence]").wait_for()
    assert "Dry run: the behaviour would not arm." in dry.inner_text()
    assert "gate evidence" in dry.inner_text() and "PROBE_ACKNOWLEDGEMENT_REQUIRED" in dry.inner_text()
    assert "cost per generated token" in dry.inner_text()  # the projected cost against the budget

    group.locator("button[data-arm]").click()
    dialog = page.page.locator("#arm-dialog")
    dialog.locator("#arm-gates li[data-gate=evidence]").wait_for()
    assert dialog.locator("#arm-ack-block").is_visible()  # below rung 2: the acknowledgement
    page.shot("arm-dialog")
    dialog.locator("#arm-confirm").click()  # without an acknowledgement: refused here, nothing sent
    assert "gate evidence" in dialog.locator("#arm-refusal").inner_text()
    dialog.locator("#arm-ack").fill("watching the UI tests")
    dialog.locator("#arm-confirm").click()
    page.page.wait_for_selector(f'section.behaviour[data-behaviour="{BEHAVIOUR}"] .badge.state:text-is("armed")')
    assert "1 of 1 armed" in page.page.locator(f'section.behaviour[data-behaviour="{BEHAVIOUR}"]').inner_text()
    with api(server) as http:
        assert http.get(f"/api/probes/{state['probe_id']}").json()["armed"] is True


def test_a_chat_verdict_appears_live(server, ui_page, state):
    page = ui_page(server)
    page.goto("/ui/probes")
    page.page.wait_for_selector("#feed-state[data-state=live]")
    with api(server) as http:
        model_id = http.get("/api/health").json()["model"]
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    reply = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=4,
        extra_headers={"X-miLLM-Session": SESSION},
    )
    verdicts = reply.model_extra["millm_probe_verdicts"]
    item = page.page.locator("#live-verdicts li").first
    item.wait_for()
    assert item.get_attribute("data-result") == verdicts[0]["result_id"]
    assert "fired" in item.locator(".verdict").inner_text()
    assert f"session {SESSION} turn 1" in item.inner_text()
    assert PROMPT not in page.page.content()  # no prompt text outside the event detail and transcript
    assert "1 results · 1 fired" in page.page.locator(f"#results-{state['probe_id']} .count").inner_text()
    state["result_id"] = verdicts[0]["result_id"]
    page.shot("live-verdict")
    item.locator("a").click()
    page.page.wait_for_selector("#decoded-window")
    with api(server) as http:
        detail = http.get(f"/api/probes/events/{state['result_id']}").json()["detail"]
    assert page.page.locator("#window-text").inner_text() == detail["context_text"]  # as text, markup and all
    assert page.page.locator("#top-token").inner_text() == detail["top_token"]
    assert "fired" in page.page.locator("h1").inner_text()
    page.shot("event-detail")


def test_results_filters_and_histogram(server, ui_page, state):
    page = ui_page(server)
    page.goto("/ui/probes?fired=true&window=all")
    results = page.page.locator(f"#results-{state['probe_id']}")
    assert results.locator(".count").inner_text() == "1 results · 1 fired"
    results.locator("summary").click()
    assert results.locator("svg.histogram rect.bin").count() > 0
    assert "off the chart, left of every score" in results.inner_text()  # the threshold is -1e9
    page.goto("/ui/probes?fired=false")
    assert page.page.locator(f"#results-{state['probe_id']} .count").inner_text() == "0 results · 0 fired"


def test_the_session_timeline_and_transcript(server, ui_page, state):
    page = ui_page(server)
    page.goto("/ui/sessions")
    row = page.page.locator("#sessions tr[data-session]", has_text=SESSION)
    assert row.locator("td").nth(1).inner_text() == "1" and row.locator("td").nth(2).inner_text() == "1"
    assert PROMPT not in page.page.content()  # the list shows no text
    row.locator("a").click()
    page.page.wait_for_selector("#timeline")
    assert page.page.locator("#session-id").inner_text() == SESSION
    cell = page.page.locator('#timeline tr[data-turn="1"] td[data-verdict]').first
    assert cell.get_attribute("data-verdict") == "fired" and "verdict-fired" in cell.get_attribute("class")
    assert page.page.locator("#timeline thead th").nth(1).inner_text() == BEHAVIOUR
    assert page.page.locator("#transcript pre.user").inner_text() == PROMPT
    page.shot("timeline")


def test_delete_the_session_keeping_its_verdicts(server, ui_page, state):
    page = ui_page(server)
    page.goto("/ui/sessions")
    page.page.locator("#sessions a", has_text=SESSION).click()
    page.page.wait_for_selector("#delete")
    page.page.locator("#delete button", has_text="keep verdicts").click()
    page.page.wait_for_url(server.base_url + "/ui/sessions")
    assert SESSION not in page.page.locator("main").inner_text()
    with api(server) as http:
        assert http.get(f"/api/probes/events/{state['result_id']}").status_code == 200  # kept, detached
        assert http.get("/api/probes/sessions").json()["data"] == []
    page.shot("deleted")


RULE_SET = {
    "format": "mi.ruleset/v1",
    "ruleset_id": "pii <i>lite<b>",  # markup, shown as text (a name holds no "/")
    "version": "1",
    "signals": {
        "card": {"kind": "pattern", "pattern": r"\b(?:\d[ -]?){13,19}\b"},
        "card_ok": {"kind": "validator", "validator": "luhn", "span_of": "card"},
        "email": {"kind": "pattern", "pattern": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"},
    },
    "expressions": {"pii": {"any": ["card_ok", "email"]}},
    "cases": [
        {"text": "card 4111 1111 1111 1111", "expect": {"pii": True, "card_ok": 1}},
        {"text": "card 4111 1111 1111 1112", "expect": {"pii": False}},
    ],
}


def test_import_a_rule_set_and_see_its_results(server, ui_page, state):
    page = ui_page(server)
    page.goto("/ui/rule-sets")
    page.page.fill("#ruleset-document", json.dumps(RULE_SET))
    page.page.click("#import-ruleset")
    card = page.settled(page.page.locator("section.ruleset"))
    assert card.locator("h2").inner_text().startswith("pii <i>lite<b> v1")
    assert card.locator(".status").inner_text() == "published"
    card.locator("input[name=text]").fill("write to someone@example.com")
    card.locator("form.try button").click()
    row = card.locator('table.evaluation tr[data-expression="pii"]')
    row.wait_for()
    assert row.locator("td").nth(1).inner_text() == "true"

    card.locator("select.attach-to").select_option(BEHAVIOUR)
    card.locator("button[data-attach]").click()
    page.settled(page.page.locator(f'section.ruleset .attached:text-is("{BEHAVIOUR}")'))
    with api(server) as http:
        model_id = http.get("/api/health").json()["model"]
    OpenAI(base_url=server.base_url + "/v1", api_key="unused").chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": "mail someone@example.com"}], max_tokens=2
    )
    page.goto("/ui/rule-sets")
    recorded = page.page.locator("#rule-results tr[data-result]")
    assert recorded.count() >= 1
    assert "pii" in recorded.first.inner_text() and BEHAVIOUR in recorded.first.inner_text()
    assert "fired · count 1" in recorded.first.inner_text()  # a rule's fires and count (it has no verdict)
    assert "someone@example.com" not in page.page.content()  # results, never the text
    page.shot("rule-sets")


CLUSTER = {
    "format": "mi.cluster/v1",
    "cluster_id": "cl_ui",
    "name": "humor <u>",
    "sae_id": "sae-ui",
    "layer": 1,
    "features": [{"index": 12, "strength": 8.0}, {"index": 40, "strength": 3.0}],
    "intensity_range": [0.5, 1.5],
}


def test_register_an_sae_and_dial_a_cluster(server, ui_page, saes):
    page = ui_page(server)
    page.goto("/ui/steering")
    page.page.fill("#register-sae input[name=path]", str(saes / "sae-ui"))
    page.page.fill("#register-sae input[name=sae_id]", "sae-ui")
    page.page.click("#register-sae button")
    row = page.settled(page.page.locator('#saes tr[data-sae="sae-ui"]'))
    row.locator("button", has_text="Attach").click()
    page.page.locator('#saes tr[data-sae="sae-ui"] td', has_text="layer 1").wait_for()
    page.shot("steering")

    page.goto("/ui/clusters")
    page.page.fill("#cluster-document", json.dumps(CLUSTER))
    page.page.click("#import-cluster-button")
    card = page.settled(page.page.locator('section.cluster[data-cluster="cl_ui"]'))
    assert card.locator("h2").inner_text().startswith("humor <u>")
    card.locator("button", has_text="Activate").click()
    page.settled(page.page.locator('section.cluster[data-cluster="cl_ui"] .badge.armed'))
    dial = page.page.locator('section.cluster[data-cluster="cl_ui"] input[data-dial]')
    dial.fill("1.4")  # a range input: fill sets the value and fires input and change
    page.page.locator('section.cluster[data-cluster="cl_ui"] output[data-stored="1.4"]').wait_for()
    assert page.page.locator('section.cluster[data-cluster="cl_ui"] output').inner_text() == "1.40"
    with api(server) as http:
        assert http.get("/api/clusters/cl_ui").json()["intensity"] == 1.4
        model_id = http.get("/api/health").json()["model"]
        chat = {"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        assert 'intensity="1.4"' in http.post("/v1/chat/completions", json=chat).headers["x-millm-steering"]
    page.shot("cluster-dialled")
    page.goto("/ui/clusters")  # the stored dial, after a reload
    assert page.page.locator('section.cluster[data-cluster="cl_ui"] input[data-dial]').input_value() == "1.4"
    page.page.locator('section.cluster[data-cluster="cl_ui"] button', has_text="Deactivate").click()
    # :text-is, not has_text: "Activate" is a substring of "Deactivate", which is there before the reload
    page.settled(page.page.locator('section.cluster[data-cluster="cl_ui"] button:text-is("Activate")'))


def test_import_a_circuit_and_read_its_rung(server, ui_page, saes):
    doc = {
        "format": "mi.circuit/v1",
        "circuit_id": "crc_ui",
        "name": "circuit <s>",
        "rung": 1,
        "intensity_range": [0.5, 1.5],
        "members": [
            {"sae_id": "sae-ui", "layer": 1, "features": [{"index": 3, "strength": 4.0}]},
            {"sae_id": "sae-ui2", "layer": 2, "features": [{"index": 7, "strength": -2.0}]},
        ],
    }
    with api(server) as http:  # registered, not attached: the circuit steers only its layer-1 member
        http.post("/api/saes", json={"path": str(saes / "sae-ui2"), "sae_id": "sae-ui2"}).raise_for_status()
    page = ui_page(server)
    page.goto("/ui/circuits")
    page.page.fill("#circuit-document", json.dumps(doc))
    page.page.click("#import-circuit-button")
    card = page.settled(page.page.locator('section.circuit[data-circuit="crc_ui"]'))
    with api(server) as http:
        language = http.get("/api/circuits/crc_ui").json()["language"]
    assert card.locator(".rung").inner_text() == f"rung 1: {language}"
    card.locator("button", has_text="Activate").click()
    page.page.locator('section.circuit[data-circuit="crc_ui"] .steers').wait_for()
    steers = page.page.locator('section.circuit[data-circuit="crc_ui"] .steers').inner_text()
    assert "sae-ui at layer 1 (1 features)" in steers and "layer 2" not in steers
    assert "X-miLLM-Circuit-Rung: 1" in steers
    page.shot("circuit")


def search_the_hub(page, words: str = "") -> None:
    page.page.fill("#hub-search input[name=q]", words)
    page.page.click("#hub-search button")


def open_hub_repo(page, repo_id: str):
    search_the_hub(page, "stakes")
    repo = page.page.locator(f'#hub-repos li[data-repo="{repo_id}"]')
    repo.locator("button.hub-open").click()
    repo.locator("table.hub-files").wait_for()
    return repo


def test_browse_the_hub_and_import_one_definition(server, ui_page, hub, hub_repos):
    page = ui_page(server)
    page.goto("/ui/probes")
    assert "Anonymous and read-only" in page.page.locator("#browse-hub").inner_text()

    hub.fault = "error"  # a Hub that is down: the page says so in the API's words, and the server serves on
    page.expected_statuses.add(502)
    try:
        search_the_hub(page)
        page.page.locator("#hub-error", has_text="hub_unavailable").wait_for()
        assert "answered HTTP 503" in page.page.locator("#hub-error").inner_text()
        page.shot("hub-down")
    finally:
        hub.fault = None
    page.expected_statuses.discard(502)

    search_the_hub(page)
    page.page.locator("#hub-repos li[data-repo]").first.wait_for()
    listed = page.page.locator("#hub-repos li[data-repo]").evaluate_all("items => items.map(i => i.dataset.repo)")
    assert listed == ["acme/other-probes", HUB_REPO]  # tagged repos only
    search_the_hub(page, "nothing-like-this")
    page.page.locator("#hub-repos li", has_text=f"No repos tagged {HUB_TAG} matched.").wait_for()

    repo = open_hub_repo(page, HUB_REPO)
    assert "Rungs as the repo's manifest states them." in repo.inner_text()
    rungs = {
        row.get_attribute("data-filename"): row.locator("td.rung").inner_text()
        for row in repo.locator("tr[data-filename]").all()
    }
    assert rungs == {
        "hs-1.probe.json": "rung 2: detects on unseen tasks",
        "hs-2.probe.json": "rung 2: detects on unseen tasks",
        "hs-3.probe.json": "rung 2: detects on unseen tasks",
        "hs-4.probe.json": "rung not stated",  # not in the manifest: never shown as 0
    }
    page.shot("hub-repo")
    repo.locator('tr[data-filename="hs-1.probe.json"] button[data-hub-import]').click()
    group = page.settled(page.page.locator(f'section.behaviour[data-behaviour="{HUB_BEHAVIOUR}"]'))
    assert "hs-1" in group.inner_text() and "rung 2: detects on unseen tasks" in group.inner_text()
    with api(server) as http:
        (probe,) = [p for p in http.get("/api/probes").json()["data"] if p["name"] == "hs-1"]
        stored = http.get(f"/api/probes/{probe['id']}/definition").content
    assert stored == (hub.root / HUB_REPO / "hs-1.probe.json").read_bytes()  # verbatim, from the listed commit
    assert any(f"/resolve/{hub.commit(HUB_REPO)}/hs-1.probe.json" in r["path"] for r in hub.requests)
    assert not any("authorization" in {k.lower() for k in r["headers"]} for r in hub.requests)  # anonymous
    page.shot("hub-imported")


def test_a_partial_set_names_the_missing_probe(server, ui_page, hub, hub_repos, state):
    """Three of the behaviour's probes armed, a fourth imported later: "partial: 3 of 4 armed", naming it."""
    with api(server) as http:
        for name in ("hs-2", "hs-3"):
            body = {"repo_id": HUB_REPO, "filename": f"{name}.probe.json"}
            assert http.post("/api/probes/hub/import", json=body).status_code == 201
    page = ui_page(server)
    page.goto("/ui/probes")
    group = page.page.locator(f'section.behaviour[data-behaviour="{HUB_BEHAVIOUR}"]')
    group.locator("button[data-arm]").click()
    dialog = page.page.locator("#arm-dialog")
    dialog.locator("#arm-gates li").first.wait_for()
    assert not dialog.locator("#arm-ack-block").is_visible()  # rung 2: no acknowledgement asked
    assert dialog.locator("#arm-gates li.ok").count() == 3
    dialog.locator("#arm-confirm").click()
    badge = f'section.behaviour[data-behaviour="{HUB_BEHAVIOUR}"] .badge.state'
    page.page.wait_for_selector(f'{badge}:text-is("armed")')

    repo = open_hub_repo(page, HUB_REPO)
    repo.locator('tr[data-filename="hs-4.probe.json"] button[data-hub-import]').click()
    page.settled(page.page.locator(f'{badge}:has-text("partial")'))
    with api(server) as http:
        probes = {p["name"]: p for p in http.get("/api/probes").json()["data"]}
        armed_at = {n: http.get(f"/api/probes/{probes[n]['id']}").json().get("armed_at") for n in ("hs-1", "hs-2")}
    missing = probes["hs-4"]["id"]
    group = page.page.locator(f'section.behaviour[data-behaviour="{HUB_BEHAVIOUR}"]')
    assert group.locator(".badge.state").inner_text() == f"partial: 3 of 4 armed, missing hs-4 ({missing})"
    assert f"missing {missing}" in group.inner_text()
    assert "disarmed" in group.locator(f'tr[data-probe="{missing}"]').inner_text()
    page.shot("partial")

    group.locator("button[data-arm]").click()  # arming again arms only the missing one
    dialog.locator("#arm-gates li").first.wait_for()
    assert "already armed" in dialog.locator("#arm-gates").inner_text()
    dialog.locator("#arm-confirm").click()
    page.page.wait_for_selector(f'{badge}:text-is("armed")')
    assert "4 of 4 armed" in page.page.locator(f'section.behaviour[data-behaviour="{HUB_BEHAVIOUR}"]').inner_text()
    with api(server) as http:
        assert all(http.get(f"/api/probes/{p['id']}").json()["armed"] for n, p in probes.items() if n.startswith("hs-"))
        for name, when in armed_at.items():  # the three already armed were left as they were
            assert http.get(f"/api/probes/{probes[name]['id']}").json().get("armed_at") == when
    state["hub_probes"] = [p["id"] for n, p in probes.items() if n.startswith("hs-")]


def test_after_a_restart_the_armed_behaviours_come_back_with_one_click(server, ui_page, state):
    """The same data directory, the model loaded at start: every probe is disarmed, and the page names
    the behaviours that were armed. At rung 2 one click arms it; below, the click opens the dialog."""
    server.env["MILLM_LOAD_ON_START"] = "true"
    server.wait_for = "ok"
    server.restart()
    page = ui_page(server)
    page.goto("/ui/probes")
    rearm = page.page.locator("#rearm")
    assert "Armed before the model was unloaded or the server restarted" in rearm.inner_text()
    buttons = rearm.locator("button.rearm").all_inner_texts()
    assert sorted(buttons) == sorted([f"Arm {HUB_BEHAVIOUR} again", f"Arm {BEHAVIOUR} again"])
    badge = f'section.behaviour[data-behaviour="{HUB_BEHAVIOUR}"] .badge.state'
    assert page.page.locator(badge).inner_text() == "disarmed"
    page.shot("rearm-offered")

    rearm.locator("button", has_text=f"Arm {HUB_BEHAVIOUR} again").click()  # one click
    page.settled(page.page.locator(f'{badge}:text-is("armed")'))
    with api(server) as http:
        assert all(http.get(f"/api/probes/{pid}").json()["armed"] for pid in state["hub_probes"])

    page.page.locator("#rearm button", has_text=f"Arm {BEHAVIOUR} again").click()  # rung 1: the dialog
    dialog = page.page.locator("#arm-dialog")
    dialog.locator("#arm-gates li").first.wait_for()
    assert dialog.locator("#arm-ack-block").is_visible()
    dialog.locator("#arm-ack").fill("still watching the UI tests")
    dialog.locator("#arm-confirm").click()
    page.page.wait_for_selector(f'section.behaviour[data-behaviour="{BEHAVIOUR}"] .badge.state:text-is("armed")')
    assert page.page.locator("#rearm").count() == 0  # nothing is left to bring back
    with api(server) as http:
        assert http.get(f"/api/probes/{state['probe_id']}").json()["armed"] is True
    page.shot("rearmed")


# --- a probe's row: Check parity, Delete; counts over every result ------------------------------------------


def import_probe(server, doc: dict) -> str:
    with api(server) as http:
        imported = http.post("/api/probes/import", json=doc)
        assert imported.status_code == 201, imported.text
        return imported.json()["id"]


def test_check_parity_shows_the_report_on_the_probes_row(server, ui_page, lab, identity):
    """The report as ``POST /api/probes/{id}/parity`` answers it: status, reason, shapes, and each vector's
    score, recorded score, difference and per-shape result; one probe that passes, one whose test vectors
    were recorded on another layer (it fails, and says why)."""
    ids = {
        "passed": import_probe(server, lab.definition(identity, name="parity <ok>", layer=2, rung=2, seed=41)),
        "failed": import_probe(
            server, lab.definition(identity, name="parity <off>", layer=2, vector_layer=3, rung=2, seed=42)
        ),
    }
    page = ui_page(server)
    page.goto("/ui/probes")
    for expected, probe_id in ids.items():
        page.page.locator(f'tr[data-probe="{probe_id}"] button[data-parity]').click()
        box = page.page.locator(f'.parity-report[id="parity-{probe_id}"]')
        status = box.locator(".parity-status")
        status.wait_for()
        with api(server) as http:
            [report] = http.get(f"/api/probes/{probe_id}/parity").json()["data"][:1]
        assert status.get_attribute("data-status") == report["status"] == expected
        assert (report["reason"] is None) == (expected == "passed")
        if report["reason"]:
            assert report["reason"] in status.inner_text()
        assert f"shapes checked: {', '.join(report['shapes_checked'])}" in box.inner_text()
        assert report["vectors"]
        for vector in report["vectors"]:
            row = box.locator(f'tr[data-vector="{vector["index"]}"]')
            for field in ("score", "recorded", "difference"):
                assert float(row.locator(f"td.{field}").inner_text()) == pytest.approx(vector[field], rel=1e-5)
            for shape in report["shapes_checked"]:
                cell = row.locator(f'td[data-shape="{shape}"]').inner_text()
                assert cell.startswith("passed" if vector["shapes"][shape]["passed"] else "failed"), cell
            assert row.locator("td.result").inner_text().startswith("passed" if vector["passed"] else "failed")
        page.shot(f"parity-{expected}")
    with api(server) as http:
        for probe_id in ids.values():
            http.delete(f"/api/probes/{probe_id}")


def test_delete_a_probe_from_its_row_disarming_it_first(server, ui_page, lab, identity):
    probe_id = import_probe(server, lab.definition(identity, name="doomed <x>", layer=2, rung=2, seed=43))
    with api(server) as http:
        assert http.post(f"/api/probes/{probe_id}/arm", json={}).status_code == 200
    page = ui_page(server)
    page.goto("/ui/probes")
    row = page.page.locator(f'tr[data-probe="{probe_id}"]')
    dialog = page.page.locator("#delete-dialog")
    row.locator("button[data-delete-probe]").click()
    assert dialog.is_visible() and dialog.locator("#delete-armed").is_visible()
    assert dialog.locator("#delete-name").inner_text() == f"doomed <x> ({probe_id})"  # the markup is text
    dialog.locator("button", has_text="Cancel").click()  # asked, refused: nothing changes
    with api(server) as http:
        assert http.get(f"/api/probes/{probe_id}").json()["armed"] is True
    row.locator("button[data-delete-probe]").click()
    page.shot("delete-dialog")
    dialog.locator("#delete-confirm").click()
    page.settled(page.page.locator("#import"))
    page.page.wait_for_function(f"!document.querySelector('tr[data-probe=\"{probe_id}\"]')")
    with api(server) as http:
        assert http.get(f"/api/probes/{probe_id}").status_code == 404
        assert probe_id not in {a["probe_id"] for a in http.get("/api/probes/status").json()["armed"]}


def test_the_counts_cover_every_result_not_the_newest_listed(server, ui_page, lab, identity):
    """More results than the page lists (200): "N results · M fired" counts them all, as the events
    list paged to its end does; the filters apply to the counts too."""
    doc = lab.definition(
        identity, name="counted", behaviour="counted", layer=2, rung=2, seed=44, threshold=0.0,
        windows=["all", "prompt", "response", "last_user"],
    )  # fmt: skip
    probe_id = import_probe(server, doc)
    with api(server) as http:
        assert http.post(f"/api/probes/{probe_id}/arm", json={}).status_code == 200
        model_id = http.get("/api/health").json()["model"]

        def chat(i: int) -> int:  # four windows each: 51 chats, 204 results
            body = {"model": model_id, "messages": [{"role": "user", "content": f"count {i}"}], "max_tokens": 1}
            return http.post("/v1/chat/completions", json=body).status_code

        with ThreadPoolExecutor(4) as pool:  # a few at once: the engine may batch them
            assert set(pool.map(chat, range(51))) == {200}
        stored, after = [], None
        while True:
            params = {"probe_id": probe_id, "limit": 500, **({"after": after} if after else {})}
            listed = http.get("/api/probes/events", params=params)
            assert listed.status_code == 200, listed.text
            stored += listed.json()["data"]
            if not listed.json()["has_more"]:
                break
            after = stored[-1]["result_id"]
    fired = sum(1 for r in stored if r["fires"])
    assert len(stored) == 204 and 0 < fired < 204  # some fire, some do not: the fired count is a real count
    page = ui_page(server)
    page.goto("/ui/probes")
    results = page.page.locator(f'details.results[data-probe="{probe_id}"]')
    assert results.locator(".count").inner_text() == f"204 results · {fired} fired"
    assert results.locator("tbody tr").count() == 200 and "(the newest 200 listed)" in results.inner_text()
    page.goto("/ui/probes?window=all")
    assert page.page.locator(f'details.results[data-probe="{probe_id}"] .count').inner_text() == (
        f"51 results · {sum(1 for r in stored if r['fires'] and r['window'] == 'all')} fired"
    )
    page.goto("/ui/probes?fired=true")
    assert page.page.locator(f'details.results[data-probe="{probe_id}"] .count').inner_text() == (
        f"{fired} results · {fired} fired"
    )
    page.shot("counts")
    with api(server) as http:
        http.post(f"/api/probes/{probe_id}/disarm")
        http.delete(f"/api/probes/{probe_id}")
