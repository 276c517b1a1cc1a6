"""The reasoning splitter and markers (``millm_host.reasoning``), with no model: text in, text out."""

from __future__ import annotations

import pytest

from millm_host.reasoning import (
    MARKERS,
    Markers,
    ReasoningSplitter,
    model_markers,
    opens_in_prompt,
    reasoning_span,
    split_text,
    template_markers,
)

THINK = Markers("<think>", "</think>")


def streamed(text: str, markers: Markers = THINK, *, inside: bool = False, step: int = 1) -> tuple[str, str, bool]:
    """``text`` fed ``step`` characters at a time: (reasoning, answer, found)."""
    splitter = ReasoningSplitter(markers, inside=inside)
    reasoning = answer = ""
    for at in range(0, len(text), step):
        more, rest = splitter.feed(text[at : at + step])
        reasoning, answer = reasoning + more, answer + rest
    more, rest = splitter.finish()
    return reasoning + more, answer + rest, splitter.found


CASES = [
    ("<think>\nhm, 2 + 2\n</think>\n\nFour.", False, ("hm, 2 + 2", "Four.")),
    ("  <think>x</think>y", False, ("x", "y")),
    ("Four. <think>later</think> is text", False, (None, "Four. <think>later</think> is text")),
    ("\n  Four.", False, (None, "\n  Four.")),  # no block: the text exactly as written
    ("<thi", False, (None, "<thi")),  # the start of a marker that never came is text
    ("<think>never closed </thi", False, ("never closed </thi", "")),
    ("<think></think>Four.", False, ("", "Four.")),
    ("opened in the prompt</think>Four.", True, ("opened in the prompt", "Four.")),
    ("\nstill thinking", True, ("still thinking", "")),
]


@pytest.mark.parametrize(("text", "inside", "expected"), CASES)
def test_whole_and_streamed_agree(text, inside, expected):
    assert split_text(text, THINK, inside=inside) == expected
    for step in (1, 2, 3, 7):
        reasoning, answer, found = streamed(text, inside=inside, step=step)
        assert (reasoning if found else None, answer) == expected


def test_only_what_could_become_the_marker_is_held():
    splitter = ReasoningSplitter(THINK)
    assert splitter.feed("<th") == ("", "")  # may yet be <think>
    assert splitter.feed("ink>abc <") == ("abc", "")  # "<" may begin </think>; the space before it too
    assert splitter.feed("b>") == (" <b>", "")  # it did not
    assert splitter.feed("</thi") == ("", "")
    assert splitter.feed("nk>\n") == ("", "")
    assert splitter.feed("ok") == ("", "ok")
    assert splitter.closed_at == len("<think>abc <b></think>")  # just past the marker


def test_a_reply_that_is_no_block_is_released_at_once():
    splitter = ReasoningSplitter(THINK)
    assert splitter.feed("Hi") == ("", "Hi")
    assert splitter.feed(" <think>") == ("", " <think>")


def test_markers_come_from_the_template():
    assert template_markers("{{ '<think>\\n' }}") == THINK
    assert template_markers("<|begin_of_thought|>") == Markers("<|begin_of_thought|>", "<|end_of_thought|>")
    assert template_markers("{{ '<thinking>' }}") == Markers("<thinking>", "</thinking>")
    assert template_markers("{{ messages }}") is None and template_markers(None) is None
    assert model_markers("auto", "plain") is None
    assert model_markers("on", "plain") == THINK  # every model, <think> by default
    assert model_markers("off", "<think>") is None
    assert all(opening != closing for opening, closing in MARKERS)


class Chars:
    """An engine whose tokens are characters (``decode`` joins them)."""

    def decode(self, ids):
        return "".join(map(chr, ids))


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_reasoning_span_counts_tokens_through_the_closing_marker():
    engine = Chars()
    prompt = ids("user: hi\nassistant:\n")
    assert reasoning_span(engine, prompt, ids("<think>ab</think>cd"), THINK).end == len("<think>ab</think>")
    assert reasoning_span(engine, prompt, ids("no block"), THINK) is None
    unclosed = reasoning_span(engine, prompt, ids("<think>abc"), THINK)
    assert (unclosed.end, unclosed.closed) == (len("<think>abc"), False)
    opened = ids("assistant:\n<think>\n")
    assert opens_in_prompt(engine.decode, opened, THINK)
    assert reasoning_span(engine, opened, ids("ab</think>cd"), THINK).end == len("ab</think>")


def test_echo_engine_with_reasoning_on(app_factory):
    """In-process, on the echo engine (it repeats the last user message): ``MILLM_REASONING=on`` splits
    every model's replies on ``<think>``; ``off`` (here: the echo engine's default ``auto``, no template
    marker) leaves them alone."""
    on = app_factory(env={"MILLM_REASONING": "on"})
    body = {"model": "echo", "messages": [{"role": "user", "content": "<think>hm</think>Hi"}]}
    with on.http() as http:
        reply = http.post("/v1/chat/completions", json=body).json()
        dropped = http.post("/v1/chat/completions", json={**body, "include_reasoning": False}).json()
        response = http.post("/v1/responses", json={"model": "echo", "input": "<think>hm</think>Hi"}).json()
    message = reply["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("hm", "Hi")
    assert reply["usage"]["completion_tokens_details"] == {"reasoning_tokens": len("<think>hm</think>")}
    assert "reasoning_content" not in dropped["choices"][0]["message"]
    assert [item["type"] for item in response["output"]] == ["reasoning", "message"]
    with app_factory().http() as http:
        plain = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert plain["content"] == "<think>hm</think>Hi" and "reasoning_content" not in plain
