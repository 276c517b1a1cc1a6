"""Root conftest: the shared fixtures for every test directory of the repository."""

from millm_host.testing.extra_plugins import make_importable

pytest_plugins = ["millm_host.testing.fixtures"]

make_importable()  # the test-only plugins (tests/plugins) are not installed; tests import their helpers
