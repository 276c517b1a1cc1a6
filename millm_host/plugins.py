"""Builds the plugin manager: the hookspecs, the built-ins and the installed plugins."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import traceback
from dataclasses import dataclass, field

import pluggy

from . import hookcalls, hookspecs
from .engine import EngineSpec
from .settings import Settings

log = logging.getLogger("millm.plugins")

ENTRY_POINT_GROUP = "millm"

# The host's own behaviour, written as plugins (registered before the installed
# ones, their hookimpls marked trylast where a plugin should be able to override).
BUILTIN_PLUGINS = ("millm_host.default_fields",)


@dataclass
class PluginRecord:
    """What ``millm plugins`` and ``/api/health`` report about one plugin."""

    name: str
    version: str | None
    module: str
    status: str  # "loaded", "disabled", "failed"
    error: str | None = None


@dataclass
class PluginReport:
    records: list[PluginRecord] = field(default_factory=list)

    @property
    def loaded(self) -> list[PluginRecord]:
        return [r for r in self.records if r.status == "loaded"]

    @property
    def failed(self) -> list[PluginRecord]:
        return [r for r in self.records if r.status == "failed"]

    def fail(self, name: str, exc: Exception) -> None:
        """Record that plugin ``name`` failed (at load or in a startup hook)."""
        error = f"{type(exc).__name__}: {exc}"
        for record in self.records:
            if record.name == name:
                record.status, record.error = "failed", error
                return
        self.records.append(PluginRecord(name, None, name, "failed", error))


def build_plugin_manager(settings: Settings, *, load_entry_points: bool = True) -> pluggy.PluginManager:
    """A new plugin manager with every enabled plugin loaded and its settings declared.

    A plugin that fails to import or register is logged and reported on
    ``pm.millm_report``; it never stops the others. ``MILLM_PLUGINS`` (an allow-list)
    and ``MILLM_DISABLE_PLUGINS`` decide which entry points load, and which of the
    modules ``MILLM_PLUGIN_MODULES`` names (plugins that are not installed, such as
    the test-only ones under ``tests/plugins``).
    """
    pm = pluggy.PluginManager("millm")
    pm.add_hookspecs(hookspecs)
    report = PluginReport()
    pm.millm_report = report  # type: ignore[attr-defined]

    for module_name in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(module_name), name=module_name)

    if load_entry_points:
        allow = settings["MILLM_PLUGINS"]
        deny = set(settings["MILLM_DISABLE_PLUGINS"] or ())
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            version = ep.dist.version if ep.dist else None
            if ep.name in deny or (allow is not None and ep.name not in allow):
                report.records.append(PluginRecord(ep.name, version, ep.value, "disabled"))
                continue
            if pm.get_plugin(ep.name) is not None:
                continue  # the same distribution seen twice on sys.path
            try:
                plugin = ep.load()
                pm.register(plugin, name=ep.name)
            except Exception as exc:  # a broken plugin is reported, never fatal
                log.error("plugin %s failed to load: %s", ep.name, exc)
                report.records.append(
                    PluginRecord(ep.name, version, ep.value, "failed", f"{type(exc).__name__}: {exc}")
                )
                log.debug("%s", traceback.format_exc())
                continue
            report.records.append(PluginRecord(ep.name, version, ep.value, "loaded"))
        for entry in settings["MILLM_PLUGIN_MODULES"] or ():
            _register_module(pm, report, entry, allow, deny)

    pm.check_pending()
    hookcalls.startup(pm, "register_settings", register=settings.declare)
    pm.millm_engines = collect_engines(pm, settings)  # type: ignore[attr-defined]
    return pm


def _register_module(
    pm: pluggy.PluginManager, report: PluginReport, entry: str, allow: list[str] | None, deny: set[str]
) -> None:
    """Register one ``name=module`` (or ``module``) of ``MILLM_PLUGIN_MODULES``, like an entry point."""
    name, sep, module_name = entry.partition("=")
    name, module_name = name.strip(), (module_name if sep else name).strip()
    if any(r.name == name for r in report.records):
        return  # also installed: its entry point was loaded (or disabled) already
    if name in deny or (allow is not None and name not in allow):
        report.records.append(PluginRecord(name, None, module_name, "disabled"))
        return
    try:
        pm.register(importlib.import_module(module_name), name=name)
    except Exception as exc:
        log.error("plugin %s failed to load: %s", name, exc)
        report.records.append(PluginRecord(name, None, module_name, "failed", f"{type(exc).__name__}: {exc}"))
        return
    version = getattr(pm.get_plugin(name), "__version__", None)
    report.records.append(PluginRecord(name, version, module_name, "loaded"))


def collect_engines(pm: pluggy.PluginManager, settings: Settings) -> list[EngineSpec]:
    """Every offered engine (a duplicate name is refused), each engine's own settings declared.

    ``build_plugin_manager`` calls it; call it again after registering a plugin by hand.
    """
    engines: dict[str, EngineSpec] = {}
    # Which engine declared each setting: collected again, an engine does not declare its own twice.
    owners: dict[str, str] = pm.__dict__.setdefault("millm_engine_settings", {})

    def register(spec: EngineSpec) -> None:
        if spec.name in engines:
            raise ValueError(f"engine {spec.name!r} is registered twice")
        for setting in spec.settings:
            if owners.get(setting.name) != spec.name:
                settings.declare(setting)
                owners[setting.name] = spec.name
        engines[spec.name] = spec

    hookcalls.startup(pm, "register_engines", register=register)
    return list(engines.values())
