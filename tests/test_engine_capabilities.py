"""Engines declare what they can do on their EngineSpec; the host asks for capabilities, never names."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from millm_host.api import EMBEDDINGS, LAYER_HOOKS, EngineSpec, ModelDescriptor, Setting, hookimpl
from millm_host.fields import FieldRegistry
from millm_host.plugins import build_plugin_manager, collect_engines
from millm_host.registry import ModelRegistry
from millm_host.settings import HOST_SETTINGS, Settings

HOOKED = EngineSpec("hooked", "x:X", "x:describe", frozenset({"hf", "gguf"}), capabilities=frozenset({LAYER_HOOKS}))
PLAIN = EngineSpec("plain", "x:X", "x:describe", frozenset({"gguf"}), capabilities=frozenset({EMBEDDINGS}))


def test_fields_claimed_by_capability_go_to_the_capable_engines_only():
    fields = FieldRegistry([HOOKED, PLAIN])
    fields.register("completions", ("steering",), requires=LAYER_HOOKS)
    assert "steering" in fields.patterns("completions", "hooked")[0]
    assert "steering" not in fields.patterns("completions", "plain")[0]
    with pytest.raises(ValueError, match="unknown capability"):
        fields.register("completions", ("x",), requires="telepathy")


def test_an_unknown_capability_is_refused_at_registration():
    with pytest.raises(ValueError, match="unknown capabilities"):
        EngineSpec("odd", "x:X", "x:describe", frozenset({"hf"}), capabilities=frozenset({"telepathy"}))


def test_the_memory_a_load_needs_is_the_engines_estimate():
    gguf = ModelDescriptor("m", "/m.gguf", "gguf", "transformers")
    hf = ModelDescriptor("m", "/m", "hf", "transformers")
    assert PLAIN.estimate_memory(gguf, 100) == 100  # none declared: the size on disk
    transformers = EngineSpec(
        "t", "x:X", "x:describe", frozenset({"gguf"}), memory_estimate="millm_engine_transformers.spec:memory_estimate"
    )
    assert transformers.estimate_memory(gguf, 100) == 800  # dequantized to float32
    assert transformers.estimate_memory(hf, 100) == 100


def test_engine_settings_are_the_engines_own_and_declared_when_it_registers():
    assert not {"MILLM_DTYPE", "MILLM_DEVICE"} & {s.name for s in HOST_SETTINGS}
    settings = Settings(environ={"MILLM_DTYPE": "bfloat16"})
    pm = build_plugin_manager(settings)
    assert settings["MILLM_DTYPE"] == "bfloat16" and settings["MILLM_DEVICE"] == "auto"
    assert settings["GGUF_N_CTX"] == 4096
    assert {spec.name for spec in pm.millm_engines} >= {"transformers", "gguf"}


def test_a_setting_two_engines_declare_fails_the_second_plugin():
    setting = Setting("SHARED_KNOB", int, 1, "a knob")

    class Engines:
        def __init__(self, spec):
            self.spec = spec

        @hookimpl
        def register_engines(self, register):
            register(self.spec)

    settings = Settings(environ={})
    pm = build_plugin_manager(settings, load_entry_points=False)
    first = EngineSpec("first", "x:X", "x:describe", frozenset({"hf"}), settings=(setting,))
    second = EngineSpec("second", "x:X", "x:describe", frozenset({"hf"}), settings=(setting,))
    pm.register(Engines(first), name="first")
    pm.register(Engines(second), name="second")
    assert [spec.name for spec in collect_engines(pm, settings)] == ["second"]  # pluggy calls the last first
    assert [r.name for r in pm.millm_report.failed] == ["first"]


@pytest.mark.parametrize(("preferred", "first"), [(None, "hooked"), ("plain", "plain")])
def test_the_engine_for_a_format_is_the_preferred_one(preferred, first):
    hooked = EngineSpec("hooked", "x:X", "x:describe", frozenset({"gguf"}), preference=1)
    host = SimpleNamespace(settings={"MILLM_ENGINE": preferred})
    registry = ModelRegistry(host, [PLAIN, hooked])
    assert registry.engine_for("gguf")[0].name == first
