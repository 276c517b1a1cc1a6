"""Chat and text completions through millm's GGUF engine, against llama-cpp-python itself.

The reference is llama-cpp-python's own ``create_chat_completion`` /
``create_completion`` on the same file (greedy, no repeat penalty: OpenAI's
temperature 0). Never transformers: llama.cpp's quantized arithmetic
legitimately differs from a dequantized float32 model.
"""

from __future__ import annotations

import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from .conftest import DEFAULT_ID, STEERING

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one, and why you like it."},
    ],
]
MAX_TOKENS = 48


def reference_chat(llm, messages, **kwargs):
    """llama-cpp-python's chat with nothing cached (its prompt cache re-decodes the last prompt token alone,
    which can round the logits apart: millm's never does, ``millm_engine_gguf.prefix``)."""
    llm.reset()
    return llm.create_chat_completion(
        messages=messages, temperature=0, max_tokens=MAX_TOKENS, repeat_penalty=1.0, **kwargs
    )


def reference_prompt(llm, messages) -> str:
    """The prompt llama-cpp-python's chat completion renders from the file's own template."""
    template = llm.metadata["tokenizer.chat_template"]
    return Jinja2ChatFormatter(template=template, eos_token="<|im_end|>", bos_token="<|im_start|>")(
        messages=messages
    ).prompt


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "multi-turn"])
def test_greedy_chat_equals_llama_cpp_create_chat_completion(gguf_server, reference_llama, messages):
    expected = reference_chat(reference_llama, messages)
    reply = gguf_server.openai().chat.completions.create(
        model=DEFAULT_ID, messages=messages, temperature=0, max_tokens=MAX_TOKENS
    )
    assert reply.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert reply.choices[0].finish_reason == expected["choices"][0]["finish_reason"]
    # Same prompt ids (one BOS either way) and same generated count.
    assert reply.usage.prompt_tokens == expected["usage"]["prompt_tokens"]
    assert reply.usage.completion_tokens == expected["usage"]["completion_tokens"]
    # GGUF_PARALLEL batches by default: a seed promises its text for the same batch shape
    assert reply.system_fingerprint == "millm:SmolLM2-135M-Instruct:Q4_1@unrecorded:unrecorded/Q4_1:gguf+continuous"


def test_prompt_has_exactly_one_bos(gguf_server, reference_llama):
    messages = CONVERSATIONS[0]
    rendered = reference_prompt(reference_llama, messages)
    ids = reference_llama.tokenize(rendered.encode(), add_bos=False, special=True)
    assert ids[0] == reference_llama.token_bos() and ids[1] != reference_llama.token_bos()
    reply = gguf_server.openai().chat.completions.create(model=DEFAULT_ID, messages=messages, max_tokens=1)
    assert reply.usage.prompt_tokens == len(ids)


def test_streaming_chat_equals_the_whole_answer(gguf_server):
    client = gguf_server.openai()
    messages = CONVERSATIONS[0]
    whole = client.chat.completions.create(model=DEFAULT_ID, messages=messages, temperature=0, max_tokens=32)
    chunks = list(
        client.chat.completions.create(
            model=DEFAULT_ID,
            messages=messages,
            temperature=0,
            max_tokens=32,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *chunks, usage_chunk = chunks  # the usage chunk is last, as OpenAI sends it, and the only one without a choice
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert text == whole.choices[0].message.content
    assert finish == [whole.choices[0].finish_reason]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].model_extra.get("millm_steering") == (
        "none" if STEERING else None
    )  # the extras ride on the finish chunk
    assert {c.system_fingerprint for c in [*chunks, usage_chunk]} == {whole.system_fingerprint}


def test_the_plain_completion_stream_loop_reads_choices_0_of_every_chunk(gguf_server):
    client = gguf_server.openai()
    whole = client.completions.create(model=DEFAULT_ID, prompt="One, two, three,", temperature=0, max_tokens=8)
    chunks = list(
        client.completions.create(model=DEFAULT_ID, prompt="One, two, three,", temperature=0, max_tokens=8, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].model_extra.get("millm_steering") == ("none" if STEERING else None)


def test_greedy_completion_equals_llama_cpp_create_completion(gguf_server, reference_llama):
    prompt = "The three primary colours are"
    reference_llama.reset()  # as reference_chat: nothing cached
    expected = reference_llama.create_completion(prompt, temperature=0, max_tokens=MAX_TOKENS, repeat_penalty=1.0)
    reply = gguf_server.openai().completions.create(
        model=DEFAULT_ID, prompt=prompt, temperature=0, max_tokens=MAX_TOKENS
    )
    assert reply.choices[0].text == expected["choices"][0]["text"]
    assert reply.choices[0].finish_reason == expected["choices"][0]["finish_reason"]
    assert reply.usage.prompt_tokens == expected["usage"]["prompt_tokens"]


def test_trailing_assistant_message_is_continued_mid_sentence(gguf_server, reference_llama):
    head = [{"role": "user", "content": "Write one sentence about cats."}]
    partial = "Cats are small, furry animals that"
    rendered = reference_prompt(reference_llama, head)
    # Everything before the partial rendered with a generation prompt, the partial appended raw.
    reference_llama.reset()
    expected = reference_llama.create_completion(
        rendered + partial, temperature=0, max_tokens=MAX_TOKENS, repeat_penalty=1.0
    )
    reply = gguf_server.openai().chat.completions.create(
        model=DEFAULT_ID,
        messages=[*head, {"role": "assistant", "content": partial}],
        temperature=0,
        max_tokens=MAX_TOKENS,
    )
    assert reply.choices[0].message.content == expected["choices"][0]["text"]
    # llama-cpp-python's chat closes the partial turn, so its model starts over.
    restarted = reference_chat(reference_llama, [*head, {"role": "assistant", "content": partial}])
    assert restarted["choices"][0]["message"]["content"] != reply.choices[0].message.content
    assert reply.usage.prompt_tokens == len(
        reference_llama.tokenize((rendered + partial).encode(), add_bos=False, special=True)
    )


def test_stop_sequences_streaming_and_not(gguf_server):
    client = gguf_server.openai()
    messages = CONVERSATIONS[0]
    free = client.chat.completions.create(model=DEFAULT_ID, messages=messages, temperature=0, max_tokens=32)
    text = free.choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    expected = text[: text.index(stop)]
    stopped = client.chat.completions.create(
        model=DEFAULT_ID, messages=messages, temperature=0, max_tokens=32, stop=[stop, "never-seen"]
    )
    assert stopped.choices[0].message.content == expected
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model=DEFAULT_ID, messages=messages, temperature=0, max_tokens=32, stop=stop, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"
    completion = client.completions.create(
        model=DEFAULT_ID, prompt="One, two, three,", temperature=0, max_tokens=32, stop=","
    )
    assert "," not in completion.choices[0].text and completion.choices[0].finish_reason == "stop"


def test_max_tokens_ends_with_length_and_counts_usage(gguf_server):
    reply = gguf_server.openai().chat.completions.create(
        model=DEFAULT_ID, messages=CONVERSATIONS[0], temperature=0, max_completion_tokens=3
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 3


def test_n_one_is_served(gguf_server):
    reply = gguf_server.openai().chat.completions.create(
        model=DEFAULT_ID, messages=CONVERSATIONS[0], temperature=0, max_tokens=4, n=1
    )
    assert len(reply.choices) == 1


def test_temperature_samples(gguf_server):
    client = gguf_server.openai()
    texts = {
        client.chat.completions.create(
            model=DEFAULT_ID, messages=CONVERSATIONS[0], temperature=1.5, top_p=0.95, max_tokens=16
        )
        .choices[0]
        .message.content
        for _ in range(4)
    }
    assert len(texts) > 1


def test_frequency_and_presence_penalties_equal_llama_cpp(gguf_server, reference_llama):
    messages = CONVERSATIONS[0]
    penalties = {"frequency_penalty": 1.0, "presence_penalty": 0.5}
    client = gguf_server.openai()
    plain = reference_chat(reference_llama, messages)
    # Under these penalties the greedy pick flips on a rounding of the last prompt token's logits: the
    # server's prompt cache (this prompt, then three generated tokens) must give the uncached answer.
    client.chat.completions.create(model=DEFAULT_ID, messages=messages, temperature=0, max_tokens=4)
    expected = reference_chat(reference_llama, messages, **penalties)
    assert expected["choices"][0]["message"]["content"] != plain["choices"][0]["message"]["content"]
    reply = client.chat.completions.create(
        model=DEFAULT_ID, messages=messages, temperature=0, max_tokens=MAX_TOKENS, **penalties
    )
    assert reply.choices[0].message.content == expected["choices"][0]["message"]["content"]
