"""Every route of the app: the host's own, then each plugin's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import falcon
import falcon.asgi

from . import hookcalls
from .errors import MillmError
from .openapi import openapi_document
from .resources.common import handle_http_error, handle_millm_error, handle_unexpected
from .resources.health import Health
from .resources.models import ManagedModel, ManagedModels, OpenAIModel, OpenAIModels
from .resources.serving import ServingResource

if TYPE_CHECKING:
    from .app import Host


class OpenAPI:
    def __init__(self, host: Host) -> None:
        self.host = host

    async def on_get(self, req, resp) -> None:
        resp.media = openapi_document(self.host.openapi_bodies)


def install(app: falcon.asgi.App, host: Host) -> None:
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(falcon.HTTPError, handle_http_error)
    app.add_error_handler(MillmError, handle_millm_error)

    app.add_route("/v1/chat/completions", ServingResource(host, "chat.completions"))
    app.add_route("/v1/completions", ServingResource(host, "completions"))
    app.add_route("/v1/embeddings", ServingResource(host, "embeddings"))
    app.add_route("/v1/responses", ServingResource(host, "responses"))
    app.add_route("/v1/models", OpenAIModels(host))
    app.add_route("/v1/models/{model_id}", OpenAIModel(host))
    app.add_route("/api/health", Health(host))
    app.add_route("/api/models", ManagedModels(host))
    managed = ManagedModel(host)
    app.add_route("/api/models/{model_id}", managed)
    app.add_route("/api/models/{model_id}/load", managed, suffix="load")
    app.add_route("/api/models/{model_id}/unload", managed, suffix="unload")
    app.add_route("/openapi.json", OpenAPI(host))

    hookcalls.startup(host.pm, "register_routes", host=host, add_route=app.add_route)
