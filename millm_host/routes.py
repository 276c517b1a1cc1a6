"""Every route of the app: the host's own, then each plugin's; and ``/openapi.json``, which lists them all."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import falcon
import falcon.asgi

from . import hookcalls
from .access import Access
from .batch_api import resources as batch_resources
from .errors import MillmError
from .openapi import DocumentInputs, RouteTable, openapi_document, operation
from .resources.common import handle_http_error, handle_millm_error, handle_unexpected
from .resources.health import Health, HealthHost
from .resources.metrics import MetricsHost, MetricsResource
from .resources.models import ManagedModel, ManagedModels, ModelAdapters, ModelsHost, OpenAIModel, OpenAIModels
from .resources.serving import EndpointHost, ServingResource
from .resources.settings import SettingsResource

if TYPE_CHECKING:
    import pluggy
    from pydantic import BaseModel

    from .batch_api.runner import BatchRunner
    from .plugin_host import PluginHost
    from .settings import Settings


class RoutesHost(EndpointHost, ModelsHost, HealthHost, MetricsHost, Protocol):
    """What installing the routes uses of the host: each resource's part, and the route table's own."""

    settings: Settings
    pm: pluggy.PluginManager
    plugin_host: PluginHost
    batches: BatchRunner
    routes: RouteTable | None
    request_schemas: dict[str, list[type[BaseModel]]]
    openapi_bodies: list[tuple[str, type[BaseModel]]]


class OpenAPI:
    """``GET /openapi.json``: built once, on the first request (every route is installed by then)."""

    def __init__(self, host: RoutesHost) -> None:
        self.host = host
        self._document: dict[str, Any] | None = None

    @operation("This document (OpenAPI 3.1)")
    async def on_get(self, req, resp) -> None:
        if self._document is None:
            self._document = document(self.host)
        resp.media = self._document


def document(host: RoutesHost) -> dict[str, Any]:
    """The OpenAPI document of every route ``host`` serves."""
    table = host.routes
    assert table is not None, "the routes are not installed"
    access = Access(host.settings)
    inputs = DocumentInputs(
        request_fields=host.request_schemas,
        bodies=host.openapi_bodies,
        guarded=lambda path: access.keys_for(path) is not None,
    )
    return openapi_document(((route, method) for route in table.routes for method in table.methods(route)), inputs)


def install(app: falcon.asgi.App, host: RoutesHost) -> None:
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_http_error)
    app.add_error_handler(MillmError, handle_millm_error)

    host.routes = table = RouteTable(app)
    add_route = table.add_route
    add_route("/v1/chat/completions", ServingResource(host, "chat.completions"))
    add_route("/v1/completions", ServingResource(host, "completions"))
    add_route("/v1/embeddings", ServingResource(host, "embeddings"))
    add_route("/tokenize", ServingResource(host, "tokenize"))  # vLLM's paths, outside /v1
    add_route("/detokenize", ServingResource(host, "detokenize"))
    add_route("/v1/responses", ServingResource(host, "responses"))
    add_route("/v1/messages", ServingResource(host, "messages"))  # Anthropic's Messages API
    add_route("/v1/messages/count_tokens", ServingResource(host, "messages.count_tokens"))
    add_route("/v1/models", OpenAIModels(host))
    add_route("/v1/models/{model_id}", OpenAIModel(host))
    health = Health(host)
    add_route("/api/health", health)
    add_route("/api/health/live", health, suffix="live")
    add_route("/api/health/ready", health, suffix="ready")
    add_route("/api/health/inference", health, suffix="inference")
    add_route("/health", health, suffix="alias")  # vLLM's and llama.cpp's liveness path (load balancers, guidellm)
    add_route("/ping", health, suffix="alias")  # SageMaker's and vLLM's
    add_route("/metrics", MetricsResource(host))
    add_route("/api/settings", SettingsResource(host.settings))
    add_route("/api/models", ManagedModels(host))
    managed = ManagedModel(host)
    add_route("/api/models/{model_id}", managed)
    add_route("/api/models/{model_id}/load", managed, suffix="load")
    add_route("/api/models/{model_id}/unload", managed, suffix="unload")
    adapters = ModelAdapters(host)
    add_route("/api/models/{model_id}/adapters", adapters)
    add_route("/api/models/{model_id}/adapters/{name}", adapters, suffix="adapter")
    add_route("/openapi.json", OpenAPI(host))
    batch_resources.install(host, add_route)

    hookcalls.startup(host.pm, "register_routes", host=host.plugin_host, add_route=add_route)
