"""A meta-test: every hookspec is documented and exercised by a plugin of this repository."""

from __future__ import annotations

import inspect

import pluggy
import pytest

from millm_host import hookspecs
from millm_host.plugins import build_plugin_manager
from millm_host.settings import Settings
from millm_host.testing.extra_plugins import in_process_environ

SPECS = sorted(
    name
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
    if getattr(fn, "millm_spec", None) is not None
)


@pytest.fixture(scope="module")
def pm() -> pluggy.PluginManager:
    return build_plugin_manager(Settings(environ=in_process_environ()))


def test_there_are_hookspecs():
    assert {"register_engines", "before_forward", "after_generate", "render_headers", "response_extras"} <= set(SPECS)


@pytest.mark.parametrize("name", SPECS)
def test_hookspec_is_documented(name):
    doc = inspect.getdoc(getattr(hookspecs, name)) or ""
    assert len(doc.split()) >= 12, f"{name} needs a docstring saying when it is called and what it returns"
    assert "Called" in doc or "called" in doc, f"{name}: say when it is called"


@pytest.mark.parametrize("name", SPECS)
def test_hookspec_is_implemented_by_a_plugin_of_this_repository(pm, name):
    impls = getattr(pm.hook, name).get_hookimpls()
    assert impls, f"no plugin of this repository implements {name}: drop it or use it"


def test_no_plugin_failed_to_load(pm):
    assert pm.millm_report.failed == []


def test_every_hookspec_has_one_call_policy():
    from millm_host.hookcalls import POLICIES

    assert set(POLICIES) == set(SPECS)


@pytest.mark.parametrize("name", SPECS)
def test_hookspec_names_its_call_policy(name):
    from millm_host.hookcalls import POLICIES

    doc = " ".join((inspect.getdoc(getattr(hookspecs, name)) or "").split())
    assert f"Policy: {POLICIES[name]} (``millm_host.hookcalls``)" in doc
    assert doc.count("Policy:") == 1, f"{name} states its policy more than once"


def test_module_docstring_lists_every_policy():
    from millm_host.hookcalls import POLICIES

    listed = " ".join((hookspecs.__doc__ or "").split())
    assert f"({', '.join(dict.fromkeys(POLICIES.values()))})" in listed
