"""The hook-call policies of millm_host.hookcalls, on a plugin manager with stand-in plugins."""

from __future__ import annotations

from types import SimpleNamespace

import pluggy
import pytest

from millm_host import hookcalls, hookspecs
from millm_host.api import InvalidParameter, hookimpl
from millm_host.plugins import PluginReport


class Broken:
    @hookimpl
    def startup(self, host):
        raise RuntimeError("startup broke")

    @hookimpl
    def model_loaded(self, host, engine):
        raise RuntimeError("load hook broke")

    @hookimpl
    def after_generate(self, ctx):
        raise RuntimeError("after_generate broke")

    @hookimpl
    def render_headers(self, ctx):
        raise RuntimeError("headers broke")

    @hookimpl
    def response_extras(self, ctx):
        raise RuntimeError("extras broke")


class Refusing:
    @hookimpl
    def after_generate(self, ctx):
        raise InvalidParameter("refused", param="x")


class Working:
    def __init__(self) -> None:
        self.calls: list[str] = []

    @hookimpl
    def startup(self, host):
        self.calls.append("startup")

    @hookimpl
    def model_loaded(self, host, engine):
        self.calls.append("model_loaded")

    @hookimpl
    def after_generate(self, ctx):
        self.calls.append("after_generate")

    @hookimpl
    def render_headers(self, ctx):
        return {"X-Working": "1"}

    @hookimpl
    def validate_request(self, ctx):
        raise InvalidParameter("no", param="y")


@pytest.fixture
def pm() -> pluggy.PluginManager:
    """A manager with the hookspecs and none of the built-ins."""
    manager = pluggy.PluginManager("millm")
    manager.add_hookspecs(hookspecs)
    manager.millm_report = PluginReport()
    return manager


def _ctx():
    return SimpleNamespace(plugin_errors=[], error=None)


def test_startup_unregisters_and_reports_a_failing_plugin(pm):
    working = Working()
    pm.register(working, name="working")
    pm.register(Broken(), name="broken")
    hookcalls.startup(pm, "startup", host=None)
    assert working.calls == ["startup"]
    assert pm.get_plugin("broken") is None
    [record] = pm.millm_report.failed
    assert (record.name, record.error) == ("broken", "RuntimeError: startup broke")


def test_a_failing_builtin_stops_the_start(pm):
    class BrokenBuiltin(Broken):
        pass

    pm.register(BrokenBuiltin(), name="millm_host.broken_builtin")
    with pytest.raises(RuntimeError, match="startup broke"):
        hookcalls.startup(pm, "startup", host=None)


def test_lifecycle_logs_and_runs_every_plugin(pm):
    working = Working()
    pm.register(working, name="working")
    pm.register(Broken(), name="broken")
    hookcalls.lifecycle(pm, "model_loaded", host=None, engine=None)
    assert working.calls == ["model_loaded"] and pm.get_plugin("broken") is not None


def test_request_hooks_propagate_the_first_error(pm):
    pm.register(Working(), name="working")
    with pytest.raises(InvalidParameter):
        hookcalls.request(pm, "validate_request", ctx=_ctx())


def test_after_generate_runs_every_plugin_and_keeps_the_first_refusal(pm):
    working = Working()
    pm.register(working, name="working")
    pm.register(Broken(), name="broken")
    pm.register(Refusing(), name="refusing")
    ctx = _ctx()
    hookcalls.after_generate(pm, ctx)
    assert working.calls == ["after_generate"]
    assert isinstance(ctx.error, InvalidParameter)


def test_rendering_drops_a_failing_plugin_and_names_it(pm):
    pm.register(Working(), name="working")
    pm.register(Broken(), name="broken")
    ctx = _ctx()
    assert hookcalls.rendering(pm, "render_headers", ctx) == [{"X-Working": "1"}]
    assert hookcalls.rendering(pm, "response_extras", ctx) == []
    assert ctx.plugin_errors == ["broken"]


def test_a_hook_called_under_another_policy_is_refused(pm):
    with pytest.raises(AssertionError, match="is a rendering hook"):
        hookcalls.lifecycle(pm, "render_headers", ctx=_ctx())
