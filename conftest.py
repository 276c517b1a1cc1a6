"""Root conftest: the shared fixtures for every test directory of the repository."""

pytest_plugins = ["millm_host.testing.fixtures"]
