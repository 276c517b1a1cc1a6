"""Root conftest: the shared fixtures for every test directory of the repository."""

pytest_plugins = ["millm_host.testing.fixtures"]


def pytest_report_header(config):
    """Whether the CPU reports AMX, and what the llama.cpp build uses (a native build's AMX path dies with SIGILL)."""
    try:
        from millm_engine_gguf.cpu import report_lines

        return report_lines()
    except ImportError:  # no GGUF engine (or no llama-cpp-python) installed
        return None
