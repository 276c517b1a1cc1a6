"""The URLs a batch may name, and what serves each line of one.

One registry per host, filled once while the routes are installed (after
``startup``): the host's OpenAI endpoints first, then each plugin's through the
``register_batch_endpoints`` hook (the probes plugin: ``/api/probes/score``).
A batch names one of them; its lines are checked with the endpoint's
``precheck`` before anything runs and served by its ``observed``, at batch
priority, as live requests to that URL are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .. import hookcalls
from ..errors import InvalidParameter

if TYPE_CHECKING:
    import pluggy

    from ..plugin_host import PluginHost
    from ..serving.base import Serving


class EndpointsHost(Protocol):
    """What collecting the batch endpoints uses of the host."""

    serving: dict[str, Serving]
    pm: pluggy.PluginManager
    plugin_host: PluginHost


#: The batch endpoints OpenAI's clients name, and the ``host.serving`` key serving each.
HOST_ENDPOINTS: Mapping[str, str] = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}


@dataclass
class BatchResult:
    """What a batch endpoint answers for one line: the body of its output line, its headers
    (only ``X-miLLM-*`` ones are kept) and the id it was served under. The host's own
    ``serving.Result`` has the same three attributes."""

    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    request_id: str | None = None


class BatchEndpoint(Protocol):
    """What serves one URL's batch lines (``register_batch_endpoints``)."""

    def precheck(self, body: dict[str, Any], headers: dict[str, str]) -> None:
        """Refuse ``body`` with a ``MillmError`` as the route would, running nothing (worker thread)."""

    def observed(
        self, body: dict[str, Any], headers: dict[str, str], *, gone: Callable[[], Awaitable[None]] | None = None
    ) -> Awaitable[Any]:
        """Serve ``body`` (event loop); a ``BatchResult``-like answer, or a ``MillmError``."""


class BatchEndpoints:
    """URL → endpoint, in the order registered (the order ``/openapi.json`` lists them in)."""

    def __init__(self) -> None:
        self._by_url: dict[str, BatchEndpoint] = {}

    def register(self, url: str, endpoint: BatchEndpoint) -> None:
        """Add ``url``; a URL registered twice, or an endpoint without the two methods, is a plugin's bug."""
        if not isinstance(url, str) or not url.startswith("/"):
            raise ValueError(f"a batch endpoint is a path starting with '/', not {url!r}")
        if url in self._by_url:
            raise ValueError(f"the batch endpoint {url} is registered twice")
        for method in ("precheck", "observed"):
            if not callable(getattr(endpoint, method, None)):
                raise ValueError(f"the batch endpoint {url} has no {method}()")
        self._by_url[url] = endpoint

    def __getitem__(self, url: str) -> BatchEndpoint:
        return self._by_url[url]

    def __contains__(self, url: object) -> bool:
        return url in self._by_url

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_url)

    def check(self, url: str) -> None:
        """A 400 naming every URL a batch may name, for one that is not among them."""
        if url not in self._by_url:
            raise InvalidParameter(
                f"endpoint {url!r} is not a batch endpoint of this server; use one of {', '.join(self._by_url)}",
                param="endpoint",
            )


def collect(host: EndpointsHost) -> BatchEndpoints:
    """The host's endpoints, then every plugin's (called once, as the routes are installed)."""
    endpoints = BatchEndpoints()
    for url, name in HOST_ENDPOINTS.items():
        endpoints.register(url, host.serving[name])
    hookcalls.startup(host.pm, "register_batch_endpoints", host=host.plugin_host, register=endpoints.register)
    return endpoints
