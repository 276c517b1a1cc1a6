"""The plugin's per-host service lives from the host's startup to its shutdown."""

from __future__ import annotations

import pytest

from millm_host.api import Settings
from millm_host.app import build
from millm_steering import plugin


def test_a_stopped_host_leaves_no_service_behind(tmp_path):
    settings = Settings(environ={"MILLM_DATA_DIR": str(tmp_path), "MILLM_LOAD_ON_START": "false"})
    _, host = build(settings)
    assert plugin.service(host).host is host.plugin_host  # the view every hook gets
    host.stop()
    with pytest.raises(RuntimeError, match="has not started"):
        plugin.service(host)
