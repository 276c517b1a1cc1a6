"""What this CPU reports and what the llama.cpp build uses (AMX above all).

A llama.cpp built with ``-march=native`` on a CPU that lists ``amx_*`` flags
runs its AMX kernels and dies there with SIGILL; the requirements build it for
portable x86-64 instead. These lines go in the test report and the load log.
"""

from __future__ import annotations

from pathlib import Path


def amx_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The ``amx_*`` flags the first CPU lists (empty: none, or no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return []
    for line in text.splitlines():
        if line.startswith("flags"):
            return sorted(flag for flag in line.partition(":")[2].split() if flag.startswith("amx"))
    return []


def llama_system_info() -> str:
    """llama.cpp's ``llama_print_system_info()`` line: the instruction sets this build uses."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()


def report_lines() -> list[str]:
    """Two lines: whether the CPU reports AMX, and the llama.cpp build's features."""
    flags = amx_flags()
    amx = f"yes ({' '.join(flags)})" if flags else "no"
    return [f"CPU reports AMX: {amx}", f"llama.cpp system info: {llama_system_info()}"]
