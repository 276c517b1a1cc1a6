"""The suite stays offline: the guard refuses the network, and what the libraries fetch on first use is local."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def test_the_guard_refuses_other_hosts():
    with pytest.raises(RuntimeError, match="offline"):
        socket.getaddrinfo("example.com", 443)
    with pytest.raises(RuntimeError, match="offline"):
        socket.create_connection(("192.0.2.1", 443), timeout=1)


def test_the_guard_reaches_a_client_run_as_a_subprocess(offline_env):
    """guidellm runs as a subprocess and spawns its workers: ``sitecustomize`` loads the guard into each."""
    reach = "import socket; socket.getaddrinfo('example.com', 443)"
    run = subprocess.run([sys.executable, "-c", reach], env=offline_env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "must stay offline" in run.stderr


def test_tiktoken_cl100k_base_loads_offline():
    """LangChain's ``OpenAIEmbeddings`` tokenizes with cl100k_base, which tiktoken downloads unless it is cached.

    The conftest points ``TIKTOKEN_CACHE_DIR`` at the copy litellm ships; tiktoken checks
    the file's sha256 against the one it expects, so this is the real encoding.
    """
    import tiktoken

    encoding = tiktoken.get_encoding("cl100k_base")
    assert encoding.encode_ordinary("hello world") == [15339, 1917]
