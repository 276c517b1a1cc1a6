"""The Models page's LoRA adapters: add one from a directory inside MILLM_LORA_DIRS, see it, remove it
(a real server, a real browser)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def lora_root(tmp_path_factory):
    return tmp_path_factory.mktemp("ui-loras")


@pytest.fixture(scope="module")
def server(server_factory, ui_model_dir, ui_env, lora_root):
    return server_factory(ui_model_dir, env=ui_env(MILLM_LORA_DIRS=str(lora_root)))


def save_adapter(model_dir, out) -> None:
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    adapted = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    adapted.save_pretrained(out)


def test_add_and_remove_an_adapter_from_the_models_page(server, ui_page, ui_model_dir, lora_root):
    save_adapter(ui_model_dir, lora_root / "tuned")  # after the start: served once the page adds it
    page = ui_page(server)
    page.goto("/ui/models")
    card = page.page.locator("section.model", has_text="probe-llama")
    assert "LoRA adapters (0)" in card.locator("details.adapters summary").inner_text()
    card.locator("details.adapters summary").click()
    card.locator("form.add-adapter input[name=name]").fill("tuned")
    card.locator("form.add-adapter input[name=path]").fill("tuned")  # relative to a MILLM_LORA_DIRS directory
    card.locator("form.add-adapter button").click()
    row = page.settled(page.page.locator("section.model", has_text="probe-llama").locator("tr[data-adapter=tuned]"))
    assert f"{server.model_id}:tuned" in row.inner_text() and str(lora_root / "tuned") in row.inner_text()
    page.shot("adapter-added")
    row.locator("button", has_text="Remove").click()
    card = page.page.locator("section.model", has_text="probe-llama")
    page.settled(card.locator("details.adapters summary", has_text="LoRA adapters (0)"))
    assert card.locator("tr[data-adapter=tuned]").count() == 0
