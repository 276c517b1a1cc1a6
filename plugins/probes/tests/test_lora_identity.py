"""A probe's identity is a base model's: a request served with a LoRA adapter is another model.

A probe definition's ``model`` block names a base model (``hf_id``, ``revision``, shape,
template) and no adapter, so an armed probe scores the base model's requests only; a
request for ``"<base>:<adapter>"`` gets every armed probe's result as ``skipped`` with
reason ``adapter_not_in_identity`` (stored like the other skips), never a score of
residuals the probe was not fitted on.
"""

from __future__ import annotations

import pytest
import torch

from millm_host.testing import chat

CHAT = [{"role": "user", "content": "Tell me about the sea."}]


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory, probe_model_dir):
    import peft
    import transformers

    root = tmp_path_factory.mktemp("loras")
    model = transformers.AutoModelForCausalLM.from_pretrained(probe_model_dir)
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    adapted.save_pretrained(root / "tuned")
    return root


@pytest.fixture(scope="module")
def app(app_factory, probe_model_dir, sae_dir, lora_dir):
    return app_factory(
        plugins="all",
        models={},
        model=str(probe_model_dir),
        env={"PROBE_SAE_DIR": str(sae_dir), "MILLM_SAE_DIRS": str(sae_dir), "MILLM_LORA_DIRS": str(lora_dir)},
    )


def test_an_adapted_request_is_not_scored_by_a_base_models_probe(app, lab, helpers):
    with app.http() as http:
        model_id = http.get("/api/health").json()["model"]
        identity = http.get(f"/api/models/{model_id}").json()
        probe = helpers.import_probe(http, lab.definition(identity, name="base-only"))
        helpers.arm(http, probe["id"])
        body = {"messages": CHAT, "max_tokens": 4, "temperature": 0}
        base = chat(http, model_id, **body)
        adapted = chat(http, f"{model_id}:tuned", **body)
    assert base.status_code == 200 and adapted.status_code == 200, (base.text, adapted.text)
    assert {r["outcome"] for r in base.json()["millm_probe_verdicts"]} == {"completed"}
    results = adapted.json()["millm_probe_verdicts"]
    assert results and {(r["outcome"], r["reason"]) for r in results} == {("skipped", "adapter_not_in_identity")}
