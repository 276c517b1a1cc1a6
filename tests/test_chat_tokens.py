"""How a chat becomes token ids: one BOS, never two; a trailing assistant message continues.

The app runs in-process with the transformers engine on tiny models (real tokenizers,
no server process); the trailing-assistant check goes through the real server.
"""

from __future__ import annotations

import pytest
import transformers

from millm_host.testing.tiny_models import tiny_llama

NO_BOS_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

MESSAGES = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def bos_model():
    """A tokenizer that adds BOS itself, and SmolLM2's template, which writes one too."""
    return tiny_llama("tiny-add-bos", add_bos=True)


def transformers_app(app_factory, model):
    """The app in this process, serving ``model`` with the transformers engine."""
    return app_factory(plugins=["engine_transformers"], checkpoint=model)


@pytest.fixture(scope="module")
def bos_server(app_factory, bos_model):
    return transformers_app(app_factory, bos_model)


def _prompt_tokens(server, messages, **extra) -> int:
    model = server.model_id
    reply = server.openai().chat.completions.create(
        model=model, messages=messages, max_tokens=1, temperature=0, **extra
    )
    return reply.usage.prompt_tokens


def test_template_that_writes_bos_gets_exactly_one(bos_server, bos_model):
    tokenizer = transformers.AutoTokenizer.from_pretrained(bos_model)
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text.startswith(tokenizer.bos_token)
    with_tokenizer_bos = tokenizer(text)["input_ids"]
    assert with_tokenizer_bos[:2] == [tokenizer.bos_token_id] * 2  # what a naive server sends
    single = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert _prompt_tokens(bos_server, MESSAGES) == len(single)


def test_template_without_bos_gets_the_tokenizers(app_factory):
    model = tiny_llama("tiny-add-bos-plain", add_bos=True, chat_template=NO_BOS_TEMPLATE)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    expected = tokenizer(text)["input_ids"]
    assert expected[0] == tokenizer.bos_token_id and expected[1] != tokenizer.bos_token_id
    assert _prompt_tokens(transformers_app(app_factory, model), MESSAGES) == len(expected)


def test_completions_honour_add_special_tokens(bos_server, bos_model):
    client = bos_server.openai()
    model = bos_server.model_id
    with_bos = client.completions.create(model=model, prompt="Hello world", max_tokens=1, temperature=0)
    without = client.completions.create(
        model=model, prompt="Hello world", max_tokens=1, temperature=0, extra_body={"add_special_tokens": False}
    )
    assert with_bos.usage.prompt_tokens == without.usage.prompt_tokens + 1


def test_trailing_assistant_message_is_continued(tiny_server, tiny_model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    partial = "The answer is"
    messages = [*MESSAGES, {"role": "assistant", "content": partial}]
    head = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    expected = tokenizer(head + partial, add_special_tokens=False)["input_ids"]
    restarted = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert len(tokenizer(restarted, add_special_tokens=False)["input_ids"]) != len(expected)
    assert _prompt_tokens(tiny_server, messages) == len(expected)
