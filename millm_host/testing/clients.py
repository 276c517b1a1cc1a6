"""The clients a test server hands out: httpx and the openai SDK, over real sockets to ``base_url``."""

from __future__ import annotations

import functools
import ssl
from typing import Any

import httpx


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client: httpx loads the CA bundle for each new client (~25 ms),
    a cost every ``with server.http()`` paid though loopback HTTP never uses it."""
    import certifi

    return ssl.create_default_context(cafile=certifi.where())


class LoopbackClients:
    """``http()``, ``openai()`` and ``v1`` for a server listening at ``self.base_url``."""

    base_url: str

    @property
    def v1(self) -> str:
        return f"{self.base_url}/v1"

    def http(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("verify", _tls())
        return httpx.Client(base_url=self.base_url, timeout=kwargs.pop("timeout", 120), **kwargs)

    def openai(self, **kwargs: Any) -> Any:
        import openai

        kwargs.setdefault("http_client", openai.DefaultHttpxClient(verify=_tls()))
        return openai.OpenAI(base_url=self.v1, api_key="not-needed", max_retries=0, **kwargs)
