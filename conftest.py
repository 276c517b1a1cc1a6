"""Root conftest: the shared fixtures for every test directory of the repository."""

from millm_host.testing.extra_plugins import make_importable

pytest_plugins = ["millm_host.testing.fixtures"]

make_importable()  # the test-only plugins (tests/plugins) are not installed; tests import their helpers


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
