"""What a serving's build_context hands the hooks: the model entry resolved once, full messages, the host."""

from __future__ import annotations

import pytest

from millm_host.app import build
from millm_host.settings import Settings

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    settings = Settings(
        environ={"MILLM_DATA_DIR": str(tmp_path_factory.mktemp("data")), "MILLM_LOAD_ON_START": "false"}
    )
    _, host = build(settings)
    yield host
    host.stop()


def test_the_context_keeps_full_messages_the_entry_and_the_host(host):
    model = next(iter(host.registry.entries))
    messages = [
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    extra = [[{"role": "user", "content": [{"type": "text", "text": "again"}]}]]
    ctx = host.serving["chat.completions"].build_context(
        {"model": model, "messages": messages, "extra_messages": extra}, {}
    )
    assert ctx.messages == [messages, extra[0]]
    assert ctx.conversations[0] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "tool", "content": "done"},
    ]
    assert ctx.conversations[1] == [{"role": "user", "content": "again"}]
    assert ctx.entry is host.registry.entries[model] and ctx.model is ctx.entry.descriptor
    assert ctx.host is host.plugin_host and ctx.engine_capabilities == ctx.entry.spec.capabilities
