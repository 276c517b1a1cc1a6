"""The Playground in a real browser on one real server on the default model (SmolLM2-135M-Instruct;
its replies are greedy, so the page's replies must equal the API's token for token): register and
attach an SAE the test builds, set two features (one by index, one found by its label), arm a probe
the test builds, send a prompt with both variants in one request, and compare the replies, the heat
map and the headers with plain API requests."""

from __future__ import annotations

import json

import httpx
import pytest

from .conftest import SCREENSHOTS, probe_lab

SAE = "pg-sae"
LAYER = 1
PROMPT = "Write one sentence about cats."
MAX_TOKENS = 12
FEATURES = [{"index": 3, "strength": 2.5}, {"index": 5, "strength": -2.0}]
LABELS = [  # Neuronpedia's export: feature 5 is found by its label
    {"modelId": "smollm2-135m", "layer": "1-res", "index": "5", "description": "cats and kittens"},
    {"modelId": "smollm2-135m", "layer": "1-res", "index": "9", "description": "Python function definitions"},
]


@pytest.fixture(scope="module")
def lab(default_checkpoint_dir):
    """The reference on the float32 checkpoint the server loads the bundled GGUF from."""
    return probe_lab(default_checkpoint_dir)


@pytest.fixture(scope="module")
def sae_root(tmp_path_factory, lab):
    root = tmp_path_factory.mktemp("pg-saes")
    lab.make_sae(root, SAE, layer=LAYER, d_sae=96)
    (root / "labels.json").write_text(json.dumps(LABELS), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def server(server_factory, ui_env, sae_root):
    return server_factory(env=ui_env(MILLM_SAE_DIRS=str(sae_root)))


def http(server) -> httpx.Client:
    return httpx.Client(base_url=server.base_url, timeout=120)


@pytest.fixture(scope="module")
def probe(server, lab):
    """A probe on the SAE's layer, imported and armed through the API; its threshold sits at 0."""
    with http(server) as client:
        model_id = client.get("/api/health").json()["model"]
        identity = client.get(f"/api/models/{model_id}").json()
        doc = lab.definition(identity, name="pg-probe", layer=LAYER, threshold=0.0, rung=2, seed=5)
        imported = client.post("/api/probes/import", json=doc)
        assert imported.status_code == 201, imported.text
        probe_id = imported.json()["id"]
        armed = client.post(f"/api/probes/{probe_id}/arm", json={})
        assert armed.status_code == 200, armed.text
    return {"id": probe_id, "name": "pg-probe", "model": model_id}


def served_fields(server) -> set[str]:
    """The chat request's fields as ``/openapi.json`` describes them."""
    with http(server) as client:
        text = client.get("/openapi.json").text
    return {name for name in ("with_unsteered", "probe_token_scores") if f'"{name}"' in text}


def api_reply(server, model: str, steering: dict, **extra) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "logprobs": True,
        "steering": steering,
        **extra,
    }
    with http(server) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def register_and_attach(page) -> None:
    """Through the Steering page, as an operator would: register the directory, attach it."""
    page.goto("/ui/steering")
    form = page.page.locator("#register-sae")
    form.locator("input[name=path]").fill(SAE)
    form.locator("input[name=sae_id]").fill(SAE)
    form.locator("button").click()
    row = page.settled(page.page.locator(f'tr[data-sae="{SAE}"]'))
    row.locator("button", has_text="Attach").click()
    page.settled(page.page.locator(f'tr[data-sae="{SAE}"] button', has_text="Detach"))


def set_features(page) -> None:
    """Feature 3 by its index, feature 5 by its label; each strength typed beside its slider."""
    p = page.page
    p.locator("#steer-mode").select_option("features")
    p.locator("#feature-query").fill("3")
    p.locator("#feature-add").click()
    p.locator("#feature-query").fill("kittens")
    p.locator("#feature-search").click()
    p.locator("#feature-results button", has_text="Add #5").click()
    assert p.locator('li.feature[data-index="5"] .feature-label').inner_text() == "cats and kittens"
    for feature in FEATURES:
        p.locator(f'li.feature[data-index="{feature["index"]}"] input.strength').fill(str(feature["strength"]))


def send(page, *, both: bool, token_scores: bool, sae_features: bool = False) -> None:
    p = page.page
    p.locator("#prompt").fill(PROMPT)
    p.locator("#temperature").fill("0")
    p.locator("#max_tokens").fill(str(MAX_TOKENS))
    p.locator("#with-unsteered").set_checked(both)
    p.locator("#token-scores").set_checked(token_scores)
    p.locator("#sae-features").set_checked(sae_features)
    p.locator("#send").click()
    p.wait_for_selector("#chat-form[data-state=done], #chat-form[data-state=failed]", timeout=120_000)
    assert p.locator("#request-error").inner_text() == "", p.locator("#request-error").inner_text()


def cells(page, variant_or_index) -> list[dict]:
    selector = (
        f'.reply[data-variant="{variant_or_index}"]'
        if isinstance(variant_or_index, str)
        else f'.reply[data-choice="{variant_or_index}"]'
    )
    return page.page.locator(f"{selector} .heatmap .tok").evaluate_all(
        "cells => cells.map(c => ({text: c.textContent, position: c.dataset.position, score: c.dataset.score}))"
    )


def assert_heat_map(found: list[dict], reply: dict) -> None:
    """One cell per reply token, each with the token's text and, where the probe scored it, its score."""
    choice = reply["choices"][0]
    tokens = [t["token"] for t in choice["logprobs"]["content"]]
    assert [c["text"] for c in found] == tokens
    assert len(found) == reply["usage"]["completion_tokens"]
    results = [r for r in reply.get("millm_probe_verdicts", []) if r.get("token_scores")]
    if not results:
        return
    scores = dict(zip(results[0]["token_scores"]["positions"], results[0]["token_scores"]["scores"], strict=True))
    prompt = reply["usage"]["prompt_tokens"]
    for i, cell in enumerate(found):
        assert int(cell["position"]) == prompt + i
        if prompt + i in scores:
            # the page's request ran both variants as rows of one batch: equal up to the batch's rounding
            assert float(cell["score"]) == pytest.approx(scores[prompt + i], abs=1e-4)
        else:
            assert cell["score"] is None


def test_playground_is_first_and_says_what_to_do_without_an_sae(server, ui_page):
    page = ui_page(server)
    page.goto("/ui")
    assert page.page.locator("header nav a").first.inner_text() == "Playground"
    page.goto("/ui/playground")
    page.page.locator("#steer-mode").select_option("none")
    assert page.page.locator("#steer-mode option[value=features]").is_disabled()
    empty = page.page.locator('[data-mode="features"] .empty').inner_text()
    assert "Register an SAELens directory and attach it" in empty
    page.shot("playground-empty")


def test_a_steered_reply_equals_the_api_reply(server, ui_page, probe):
    """One variant (the field every server serves): the page's reply, token cells and verdicts equal
    the API's non-streamed answer to the same request; the steering header is rendered with its hash."""
    page = ui_page(server)
    register_and_attach(page)
    with http(server) as client:
        imported = client.post(f"/api/saes/{SAE}/labels", json={"path": "labels.json"})
        assert imported.status_code in (200, 201), imported.text
    page.goto("/ui/playground")
    page.page.wait_for_load_state("load")
    set_features(page)
    send(page, both=False, token_scores=False, sae_features=True)
    steered = api_reply(server, probe["model"], {"sae_id": SAE, "features": FEATURES})
    found = cells(page, 0)
    assert "".join(c["text"] for c in found) == steered["choices"][0]["message"]["content"]
    assert_heat_map(found, steered)
    verdicts = page.page.locator('.reply[data-choice="0"] .reply-verdicts tr[data-result="pg-probe"]')
    assert verdicts.count() >= 1
    header = page.page.locator("#steering-header")
    assert header.locator('li[data-kind="inline"]').count() == 1
    assert "sha256:" in header.locator("code.hash").inner_text()
    page.page.locator("#copy-curl").click()
    assert "/v1/chat/completions" in page.page.locator("#request-json").inner_text()
    page.page.locator("#copy-python").click()
    assert "extra_body=" in page.page.locator("#request-json").inner_text()
    page.page.locator('.reply[data-choice="0"] .tok').first.hover()  # its top SAE features (return_sae_activations)
    detail = page.page.locator("#token-detail")
    assert "Top SAE features" in detail.inner_text() and detail.locator("li").count() >= 1
    page.page.locator('.reply[data-choice="0"] .tok').last.focus()  # the last token is never read back
    assert "No SAE activation here" in detail.inner_text()
    page.shot("playground-steered")


def test_steered_and_unsteered_side_by_side(server, ui_page, probe):
    """Both variants from one request: each equals the API's plain request (steered with the two
    features; unsteered with ``"features": []``), and each heat map carries its probe's token scores."""
    assert served_fields(server) == {"with_unsteered", "probe_token_scores"}  # documented in /openapi.json
    page = ui_page(server)
    page.goto("/ui/playground")
    page.page.wait_for_load_state("load")
    set_features(page)
    send(page, both=True, token_scores=True)
    assert page.page.locator(".reply").count() == 2
    steered = api_reply(server, probe["model"], {"sae_id": SAE, "features": FEATURES}, probe_token_scores=True)
    unsteered = api_reply(server, probe["model"], {"features": []}, probe_token_scores=True)
    for variant, reply in (("steered", steered), ("unsteered", unsteered)):
        found = cells(page, variant)
        assert "".join(c["text"] for c in found) == reply["choices"][0]["message"]["content"]
        assert_heat_map(found, reply)
        assert any(c["score"] is not None for c in found)
    page.shot("playground")
    docs_shot = SCREENSHOTS / "playground.png"
    page.page.screenshot(path=str(docs_shot), full_page=True)


def test_every_page_has_a_screenshot(server, ui_page):
    page = ui_page(server)
    page.goto("/ui")
    paths = page.page.locator("header nav a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    for path in paths:
        page.goto(path)
        page.page.wait_for_load_state("load")
        assert page.page.locator("h1").count() == 1, path
        page.shot(path.strip("/").replace("/", "-") or "root")
    page.page.set_viewport_size({"width": 420, "height": 900})
    page.goto("/ui/playground")
    page.page.wait_for_load_state("load")
    assert page.page.evaluate("document.documentElement.scrollWidth") <= 440  # no sideways scroll
    page.shot("playground-narrow")


def canned_stream() -> str:
    """A two-variant stream as the contract describes it (each chunk's choices carry ``index`` and
    ``millm_variant``; each choice's verdicts with ``token_scores``; the steering chunk last)."""

    def chunk(**fields) -> str:
        return (
            "data: "
            + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", **fields})
            + "\n\n"
        )

    def token(index: int, variant: str, text: str) -> str:
        lp = {"content": [{"token": text, "logprob": -0.1, "bytes": None, "top_logprobs": []}]}
        return chunk(choices=[{"index": index, "millm_variant": variant, "delta": {"content": text}, "logprobs": lp}])

    def verdict(scores: list[float]) -> dict:
        return {
            "name": "pg-probe", "kind": "probe", "window": "all", "score": 0.5, "threshold": 0.0, "verdict": True,
            "token_scores": {"positions": [10, 11], "scores": scores},
        }  # fmt: skip

    parts = [
        token(0, "steered", "Hel"),
        token(1, "unsteered", "Good"),
        token(0, "steered", "lo!"),
        token(1, "unsteered", "bye"),
    ]
    parts.append(chunk(choices=[{"index": 0, "millm_variant": "steered", "delta": {}, "finish_reason": "length"},
                                {"index": 1, "millm_variant": "unsteered", "delta": {}, "finish_reason": "length"}]))  # fmt: skip
    parts.append(chunk(choices=[{"index": 1, "millm_variant": "unsteered", "delta": {}, "millm_probe_verdicts": [verdict([-1.0, -2.0])]}]))  # fmt: skip
    parts.append(chunk(choices=[], millm_probe_verdicts=[verdict([1.5, 2.5])]))
    parts.append(chunk(choices=[], usage={"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}))
    sha = "sha256:" + "ab" * 32
    parts.append(chunk(choices=[], millm_steering=f'inline;sae="{SAE}";layer=1;features=2;hash="{sha}";clamped=1'))
    return "".join(parts) + "data: [DONE]\n\n"


def test_a_two_variant_stream_is_drawn_side_by_side(server, ui_page):
    """The page's reading of the contract, on a canned stream (the server's answer is replaced in the
    browser): two columns by ``millm_variant``, each heat map with its own choice's token scores."""
    page = ui_page(server)
    page.goto("/ui/playground")
    page.page.wait_for_load_state("load")
    page.page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200,
            body=canned_stream(),
            headers={
                "Content-Type": "text/event-stream",
                "X-miLLM-Model": "m",
                "X-miLLM-Seed": "7",
                "X-miLLM-Ignored-Fields": '"foo", "messages[0].name"',
            },
        ),
    )
    send(page, both=True, token_scores=True)
    assert [c["text"] for c in cells(page, "steered")] == ["Hel", "lo!"]
    assert [c["score"] for c in cells(page, "steered")] == ["1.5", "2.5"]
    assert [c["score"] for c in cells(page, "unsteered")] == ["-1", "-2"]
    assert page.page.locator('.reply[data-variant="unsteered"] h3').inner_text() == "Unsteered"
    header = page.page.locator("#steering-header").inner_text()
    assert "features clamped at ±200" in header and "sha256:" + "ab" * 32 in header
    headers = page.page.locator("#headers")
    assert "X-miLLM-Model" in headers.inner_text() and "the seed applied" in headers.inner_text()
    ignored = headers.locator('tr[data-header="x-millm-ignored-fields"] code').all_inner_texts()
    assert ignored == ["foo", "messages[0].name"]
