"""Servers, models and an independent reference computation for the scoring tests.

The reference loads the same checkpoint with transformers in this process, in
float32, and computes what the server should answer from it directly; it never
calls the server's own code.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
import transformers

from millm_host.testing.tiny_models import tiny_llama

GATE_DIR = Path(__file__).parent / "gate"


class Reference:
    """A direct float32 forward of a checkpoint, for the numbers the server must match."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    @torch.inference_mode()
    def logits(self, ids: list[int]) -> torch.Tensor:
        return self.model(torch.tensor([ids])).logits[0, -1].float()

    def logprobs(self, ids: list[int], temperature: float = 0.0) -> torch.Tensor:
        logits = self.logits(ids)
        if temperature > 0:
            logits = logits / temperature
        return torch.log_softmax(logits, dim=-1)

    @torch.inference_mode()
    def last_hidden(self, ids: list[int]) -> torch.Tensor:
        return self.model.model(torch.tensor([ids])).last_hidden_state[0].float()

    def ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    def chat_text(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="session")
def reference(tiny_model_dir) -> Reference:
    """The tiny float32 model that ``tiny_server`` serves."""
    return Reference(tiny_model_dir)


@pytest.fixture(scope="session")
def bf16_model_dir() -> Path:
    return tiny_llama("tiny-bf16", dtype="bfloat16", seed=3)


@pytest.fixture(scope="session")
def bf16_reference(bf16_model_dir) -> Reference:
    """The bfloat16 checkpoint read in float32: what float32 scoring must reproduce."""
    return Reference(bf16_model_dir)


@pytest.fixture(scope="session")
def gate_env(tmp_path_factory) -> dict[str, str]:
    """Environment that loads the test-only gate plugin into a server (no install needed)."""
    root = tmp_path_factory.mktemp("gate-plugin")
    shutil.copy(GATE_DIR / "millm_test_gate.py", root)
    info = root / "millm_test_gate-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: millm-test-gate\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[millm]\ntest_gate = millm_test_gate\n")
    # Prepended, not replacing: a checkout run through PYTHONPATH keeps its own host and plugins.
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    # The gate holds a generation in before_forward; only on the serial backend is that the engine thread
    # (continuous batching runs each generation on a thread of its own), so later requests queue behind it.
    return {"PYTHONPATH": path, "TEST_GATE_FILE": str(root / "open"), "MILLM_BATCHING": "serial"}


@pytest.fixture(scope="session")
def bf16_env(gate_env) -> dict[str, str]:
    return {"MILLM_DTYPE": "bfloat16", **gate_env}


@pytest.fixture(scope="session")
def extra_models(tmp_path_factory, bf16_model_dir) -> dict[str, Path]:
    """A models directory: the bf16 model, one without a chat template, one whose tokenizer adds
    BOS, a quantized one and broken ones."""
    folder = tmp_path_factory.mktemp("models")
    models = {
        "bf16": bf16_model_dir,
        "no_template": tiny_llama("tiny-no-template", chat_template=False),
        "add_bos": tiny_llama("tiny-add-bos", add_bos=True),  # the tokenizer adds BOS; the template writes one
        **broken_models(folder / "made"),
        "bitnet": bitnet_model(folder / "made" / "tiny-bitnet", bf16_model_dir),
    }
    served = folder / "served"
    served.mkdir()
    for name, path in models.items():
        (served / name).symlink_to(path)
    return {"dir": served, **{name: served / name for name in models}}


BROKEN_PROMPT = "The quick brown fox"
NAN_TOKEN = " zebra"
NEG_INF_TOKEN = " kangaroo"


def broken_models(folder: Path) -> dict[str, Path]:
    """``broken``: token NAN_TOKEN's (tied) row is NaN, and NEG_INF_TOKEN's logit after
    BROKEN_PROMPT is -inf; ``zero_norm``: the final norm is zero, so every hidden state is."""
    base = tiny_llama("tiny-broken-base", seed=5)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base)
    (nan_id,) = tokenizer(NAN_TOKEN)["input_ids"]
    (neg_id,) = tokenizer(NEG_INF_TOKEN)["input_ids"]
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        hidden = model.model(torch.tensor([tokenizer(BROKEN_PROMPT)["input_ids"]])).last_hidden_state[0, -1].float()
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        weight[nan_id] = float("nan")
        # Each product large and of one sign: their sum overflows to -inf (signs near 0 left out).
        weight[neg_id] = torch.where(hidden.abs() > 0.05, -3e38 * torch.sign(hidden), torch.zeros_like(hidden))
    out = {}
    out["broken"] = folder / "tiny-broken"
    model.save_pretrained(out["broken"])
    tokenizer.save_pretrained(out["broken"])
    zero = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    with torch.no_grad():
        zero.model.norm.weight.zero_()
    out["zero_norm"] = folder / "tiny-zero-norm"
    zero.save_pretrained(out["zero_norm"])
    tokenizer.save_pretrained(out["zero_norm"])
    return out


def bitnet_model(target: Path, base: Path) -> Path:
    """A pre-quantized checkpoint (transformers' BitNet, which loads on a CPU): packed uint8
    weights in every decoder linear layer, random, with the config's quantization_config."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if ".layers." in name and name.endswith(".weight") and tensor.dim() == 2:
            packed = (tensor.shape[0] // 4, tensor.shape[1])  # four 2-bit values per byte
            tensors[name] = torch.randint(0, 256, packed, dtype=torch.uint8, generator=generator)
            tensors[name.removesuffix("weight") + "weight_scale"] = torch.ones(1, dtype=torch.bfloat16)
        elif name != "lm_head.weight":  # tied to the embeddings
            tensors[name] = tensor.contiguous()
    target.mkdir(parents=True)
    safetensors.torch.save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "bitnet",
        "modules_to_not_convert": ["lm_head"],
        "linear_class": "bitlinear",
        "quantization_mode": "offline",
    }
    (target / "config.json").write_text(json.dumps(config))
    transformers.AutoTokenizer.from_pretrained(base).save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def bf16_server(server_factory, extra_models, bf16_env):
    """bfloat16 serving of the bf16 tiny model; the other test models load on demand."""
    return server_factory("bf16", shared=True, env={**bf16_env, "MILLM_MODELS_DIR": str(extra_models["dir"])})
