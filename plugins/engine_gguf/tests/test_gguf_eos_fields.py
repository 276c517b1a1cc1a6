"""``ignore_eos`` and ``min_tokens`` (vLLM's names) on a GGUF model: the sampler chain's first stage masks EOS."""

from __future__ import annotations

from .conftest import DEFAULT_ID

#: Greedy SmolLM2 answers this in a few dozen tokens and ends its turn (EOS).
MESSAGES = [{"role": "user", "content": "Say hi."}]


def test_ignore_eos_generates_until_max_tokens(gguf_server):
    client = gguf_server.openai()
    plain = client.chat.completions.create(model=DEFAULT_ID, messages=MESSAGES, max_tokens=48, temperature=0)
    assert plain.choices[0].finish_reason == "stop"
    longer = plain.usage.completion_tokens + 8
    kept = client.chat.completions.with_raw_response.create(
        model=DEFAULT_ID, messages=MESSAGES, max_tokens=longer, temperature=0, extra_body={"ignore_eos": True}
    )
    reply = kept.parse()
    assert (reply.choices[0].finish_reason, reply.usage.completion_tokens) == ("length", longer)
    assert reply.choices[0].message.content.startswith(plain.choices[0].message.content)
    assert "ignore_eos" not in kept.headers.get("x-millm-ignored-fields", "")


def test_min_tokens_holds_eos_and_stop_back(gguf_server):
    client = gguf_server.openai()
    plain = client.chat.completions.create(model=DEFAULT_ID, messages=MESSAGES, max_tokens=48, temperature=0)
    least = plain.usage.completion_tokens + 6
    held = client.chat.completions.create(
        model=DEFAULT_ID, messages=MESSAGES, max_tokens=48, temperature=0, extra_body={"min_tokens": least}
    )
    assert held.usage.completion_tokens >= least
    # a stop sequence found in the text before min_tokens does not end it
    first = plain.choices[0].message.content[:2]
    stopped = client.chat.completions.create(
        model=DEFAULT_ID, messages=MESSAGES, max_tokens=48, temperature=0, stop=[first], extra_body={"min_tokens": 4}
    )
    assert stopped.usage.completion_tokens >= 4 and stopped.choices[0].message.content.startswith(first)
