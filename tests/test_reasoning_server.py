"""Reasoning output on a real ``millm serve``, through the official ``openai`` SDK.

The model is tiny and random, with SmolLM2's tokenizer and a chat template that thinks
(``THINKING_CHAT_TEMPLATE``: it holds ``<think>``, so ``MILLM_REASONING=auto`` splits its replies);
the test-only ``scripted_output`` plugin makes it write a given reply. SmolLM2's tokenizer writes
``<think>`` as three tokens (``<``, ``think``, ``>``), so every block here has its markers split across
tokens. Its weights are the probes' test model's (same seed and shape), so a probe built by the
probes' ``Lab`` passes its parity gate here, for the ``reasoning`` and ``answer`` windows.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from millm_host.testing import ServerProcess

pytestmark = pytest.mark.slow

THINKING = "Let me add 2 and 2. That is 4."
ANSWER = "The answer is 4."
REPLY = f"<think>\n{THINKING}\n</think>\n\n{ANSWER}"
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
BEHAVIOUR = "leaks"
LEAK_SET = {
    "format": "mi.ruleset/v1",
    "ruleset_id": "password-leak",
    "version": "1",
    "signals": {"password": {"kind": "wordlist", "words": {"swordfish": 1.0}, "min_weight": 1.0}},
    "expressions": {"leak": {"signal": "password"}},
}


def _probe_shape() -> dict[str, Any]:
    """The probes' test model's shape (``plugins/probes/tests/conftest.py``: ``probe_model_dir``)."""
    return {"num_hidden_layers": 4, "max_position_embeddings": 4096, "seed": 7}


@pytest.fixture(scope="module")
def thinking_model_dir() -> Path:
    from millm_host.testing.tiny_models import THINKING_CHAT_TEMPLATE, tiny_llama

    return tiny_llama("probe-llama-thinking", chat_template=THINKING_CHAT_TEMPLATE, **_probe_shape())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, thinking_model_dir: Path):
    process = ServerProcess(
        tmp_path_factory.mktemp("reasoning"),
        model=str(thinking_model_dir),
        env={"SCRIPTED_OUTPUT_ENABLED": "true", "RULE_TIME_BUDGET_MS": "10000"},
    )
    with process:
        yield process


@pytest.fixture(scope="module")
def client(server):
    return server.openai()


def scripted(text: str) -> dict[str, str]:
    from millm_scripted_output import HEADER, encode

    return {HEADER: encode(text)}


def ask(client, model: str, reply: str, **extra: Any):
    return client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=64, extra_headers=scripted(reply), **extra
    )


def stream_parts(client, model: str, reply: str, **extra: Any) -> list[tuple[str, str]]:
    """The stream's deltas in order, as ``("reasoning" | "content", text)``."""
    parts = []
    for chunk in ask(client, model, reply, stream=True, **extra):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning = (delta.model_extra or {}).get("reasoning_content")
        if reasoning:
            parts.append(("reasoning", reasoning))
        if delta.content:
            parts.append(("content", delta.content))
    return parts


def joined(parts: list[tuple[str, str]], kind: str) -> str:
    return "".join(text for k, text in parts if k == kind)


def test_the_marker_is_split_across_tokens(server):
    """What every test below relies on: SmolLM2's tokenizer writes each marker in several tokens."""
    with server.http() as http:
        tokens = http.post(
            "/tokenize", json={"model": server.model_id, "prompt": "<think>", "add_special_tokens": False}
        )
    assert tokens.json()["count"] > 1, tokens.text


def test_reply_carries_reasoning_content(client, server):
    completion = ask(client, server.model_id, REPLY)
    message = completion.choices[0].message
    assert message.content == ANSWER
    assert message.model_extra["reasoning_content"] == THINKING
    # the tokens through the closing marker (OpenAI's completion_tokens_details.reasoning_tokens)
    with server.http() as http:
        block = http.post(
            "/tokenize",
            json={"model": server.model_id, "prompt": f"<think>\n{THINKING}\n</think>", "add_special_tokens": False},
        ).json()["count"]
    assert completion.usage.completion_tokens_details.reasoning_tokens == block


def test_stream_sends_reasoning_deltas_then_content(client, server):
    parts = stream_parts(client, server.model_id, REPLY)
    assert joined(parts, "reasoning") == THINKING
    assert joined(parts, "content") == ANSWER
    kinds = [kind for kind, _ in parts]
    assert kinds == sorted(kinds, key=lambda k: k != "reasoning")  # every reasoning delta before the answer
    assert kinds.count("reasoning") > 1  # streamed as it comes, not in one piece at the end
    assert not any("<" in text or "think>" in text for _, text in parts)  # no piece of a marker leaks


def test_include_reasoning_false_drops_it(client, server):
    message = ask(client, server.model_id, REPLY, extra_body={"include_reasoning": False}).choices[0].message
    assert message.content == ANSWER
    assert "reasoning_content" not in (message.model_extra or {})
    parts = stream_parts(client, server.model_id, REPLY, extra_body={"include_reasoning": False})
    assert parts and {kind for kind, _ in parts} == {"content"} and joined(parts, "content") == ANSWER


def test_a_reply_without_a_block_is_all_answer(client, server):
    text = "Four. A <think> later on is text."
    message = ask(client, server.model_id, text).choices[0].message
    assert message.content == text
    assert message.model_extra["reasoning_content"] is None
    parts = stream_parts(client, server.model_id, text)
    assert joined(parts, "content") == text and not joined(parts, "reasoning")


def test_a_template_that_opens_the_block(client, server):
    """Generation starts inside the block: the reply holds only its closing marker."""
    extra = {"extra_body": {"chat_template_kwargs": {"open_think": True}}}
    message = ask(client, server.model_id, f"{THINKING}</think>{ANSWER}", **extra).choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == (THINKING, ANSWER)
    parts = stream_parts(client, server.model_id, f"{THINKING}</think>{ANSWER}", **extra)
    assert (joined(parts, "reasoning"), joined(parts, "content")) == (THINKING, ANSWER)


def test_responses_api_returns_a_reasoning_item(client, server):
    response = client.responses.create(
        model=server.model_id, input="What is 2 + 2?", max_output_tokens=64, extra_headers=scripted(REPLY)
    )
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert [(part.type, part.text) for part in reasoning.content] == [("reasoning_text", THINKING)]
    assert message.type == "message" and response.output_text == ANSWER
    assert response.usage.output_tokens_details.reasoning_tokens > 0

    dropped = client.responses.create(
        model=server.model_id,
        input="What is 2 + 2?",
        max_output_tokens=64,
        extra_headers=scripted(REPLY),
        extra_body={"include_reasoning": False},
    )
    assert [item.type for item in dropped.output] == ["message"] and dropped.output_text == ANSWER


def test_responses_stream_has_reasoning_events(client, server):
    with client.responses.stream(
        model=server.model_id, input="What is 2 + 2?", max_output_tokens=64, extra_headers=scripted(REPLY)
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = [event.delta for event in events if event.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == THINKING and len(deltas) > 1
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [(item.type, event_index) for event_index, item in enumerate(done)] == [("reasoning", 0), ("message", 1)]
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output[0].content[0].text == THINKING and final.output_text == ANSWER


def _probes_lab() -> Any:
    """The probes plugin's test ``Lab`` (loaded by path: test modules are not importable)."""
    path = Path(__file__).resolve().parents[1] / "plugins" / "probes" / "tests" / "conftest.py"
    spec = importlib.util.spec_from_file_location("millm_probes_tests_conftest_reasoning", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_and_rule_windows_over_the_reasoning(server):
    from millm_host.testing.tiny_models import tiny_llama

    module = _probes_lab()
    lab = module.Lab(tiny_llama("probe-llama", **_probe_shape()))  # the same weights, SmolLM2's template
    windows = ["response", "reasoning", "answer"]
    thinking, answer = "The password is swordfish, do not say it.", "I cannot help with that."
    reply = f"<think>{thinking}</think>{answer}"
    with server.http() as http:
        identity = http.get(f"/api/models/{server.model_id}").json()
        doc = lab.definition(identity, name="leak-watch", behaviour=BEHAVIOUR, windows=windows, rule="mean")
        probe = http.post("/api/probes/import", json=doc)
        assert probe.status_code == 201, probe.text
        probe_id = probe.json()["id"]
        assert http.post(f"/api/probes/{probe_id}/arm", json={}).status_code == 200
        rule_set = http.post("/api/rule-sets/import", json=LEAK_SET)
        assert rule_set.status_code == 201, rule_set.text
        attach = http.put(
            f"/api/probes/behaviours/{BEHAVIOUR}/rule-signals", json={"rule_set_id": rule_set.json()["id"]}
        )
        assert attach.status_code == 200, attach.text
        try:
            body = http.post(
                "/v1/chat/completions",
                json={"model": server.model_id, "messages": QUESTION, "max_tokens": 64},
                headers=scripted(reply),
            ).json()
            plain = http.post(
                "/v1/chat/completions",
                json={"model": server.model_id, "messages": QUESTION, "max_tokens": 64},
                headers=scripted("No block here."),
            ).json()
            block = len(lab.tokenizer(f"<think>{thinking}</think>", add_special_tokens=False)["input_ids"])
            generated = body["usage"]["completion_tokens"]
        finally:
            http.post(f"/api/probes/{probe_id}/disarm")
            http.delete(f"/api/probes/{probe_id}")
    assert body["choices"][0]["message"]["content"] == answer
    results = {(r["kind"], r["window"]): r for r in body["millm_probe_verdicts"]}
    # the probe: the block's tokens, then the answer's (each generated token was fed back to draw EOS)
    assert results[("probe", "reasoning")]["n_scored_tokens"] == block
    assert results[("probe", "answer")]["n_scored_tokens"] == generated - block
    assert results[("probe", "response")]["n_scored_tokens"] == generated
    assert {r["outcome"] for r in results.values()} == {"completed"}
    # the rule: the password is in the reasoning, not in the answer
    assert (results[("rule", "reasoning")]["fires"], results[("rule", "answer")]["fires"]) == (True, False)
    assert results[("rule", "response")]["fires"] is True
    # a reply with no block: reasoning is skipped, the answer is the whole reply
    plain_results = {(r["kind"], r["window"]): r for r in plain["millm_probe_verdicts"]}
    assert (plain_results[("probe", "reasoning")]["outcome"], plain_results[("probe", "reasoning")]["reason"]) == (
        "skipped",
        "no_reasoning_block",
    )
    assert (
        plain_results[("probe", "answer")]["n_scored_tokens"] == plain_results[("probe", "response")]["n_scored_tokens"]
    )


def test_anthropics_messages_api_shows_the_block_as_thinking_blocks_only_when_asked(server):
    """``/v1/messages`` through the official ``anthropic`` SDK: ``thinking`` enabled gives a ``thinking``
    block before the text (streamed as ``thinking_delta``s); left out or disabled, the reply is the answer
    alone, as Anthropic's is. A reply's thinking block sent back in an assistant turn is accepted."""
    import anthropic

    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    ask_for = {"model": server.model_id, "max_tokens": 64, "messages": QUESTION, "extra_headers": scripted(REPLY)}
    for thinking in (None, {"type": "disabled"}):
        plain = client.messages.create(**ask_for, **({"thinking": thinking} if thinking else {}))
        assert [(b.type, b.text) for b in plain.content] == [("text", ANSWER)]
    raw = client.messages.with_raw_response.create(**ask_for, thinking={"type": "enabled", "budget_tokens": 1024})
    shown = raw.parse()
    assert [b.type for b in shown.content] == ["thinking", "text"]
    assert (shown.content[0].thinking, shown.content[0].signature, shown.content[1].text) == (THINKING, "", ANSWER)
    assert "thinking.budget_tokens" in raw.headers["x-millm-ignored-fields"]  # the template decides, not a budget
    kinds = []
    with client.messages.stream(**ask_for, thinking={"type": "adaptive"}) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                kinds.append(event.delta.type)
        final = stream.get_final_message()
    assert kinds[0] == "thinking_delta" and "text_delta" in kinds
    assert kinds.index("text_delta") > max(i for i, kind in enumerate(kinds) if kind == "thinking_delta")
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in final.content] == [
        ("thinking", THINKING),
        ("text", ANSWER),
    ]
    turns = [
        *QUESTION,
        {"role": "assistant", "content": [shown.content[0].model_dump(), {"type": "text", "text": ANSWER}]},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    again = client.messages.create(**{**ask_for, "messages": turns})
    assert again.content[0].type == "text"
