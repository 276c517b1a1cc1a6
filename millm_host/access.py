"""Who may call what: API keys, allowed Host names, cross-site requests and CORS.

One Falcon middleware checks every request before routing, so plugin routes are
covered without doing anything. Everything is off by default except what a
server on loopback needs against web pages its operator visits:

- ``Host`` must name this server (``MILLM_ALLOWED_HOSTS``; loopback names by
  default, any port): a page that rebinds its DNS name to 127.0.0.1 is refused
  (``400 host_not_allowed``; 400 rather than 421, as Django does, because 421
  asks HTTP/2 clients to retry on another connection, which cannot help).
- A state-changing request (POST, PUT, PATCH, DELETE) whose body is not
  ``application/json`` (or ``+json``) is refused with ``415``; one with no body
  may omit ``Content-Type``. A browser sends JSON across sites only after a CORS
  preflight, which fails unless ``MILLM_CORS_ORIGINS`` allows the page.
- A state-changing request that a browser marks as coming from another origin
  (``Origin`` not this server nor a CORS origin) is refused with ``403``: this
  covers the body-less POST (``fetch(url, {method: "POST", mode: "no-cors"})``).

Keys (``Authorization: Bearer <key>``, as OpenAI clients send, or ``X-Api-Key: <key>``, as Anthropic's do) are optional:

- ``MILLM_API_KEYS`` guards ``/v1`` (and ``/tokenize``, ``/detokenize``); admin keys are accepted there too.
- ``MILLM_ADMIN_API_KEYS`` guards everything else (every ``/api`` route, reads
  included, since they show paths and probe data; ``/metrics`` too) except
  ``/api/health`` (and its ``/live`` and ``/ready``), ``/openapi.json`` and the web UI's pages (``/ui``,
  whose data come from the API, with the key). Without admin keys these routes take the API keys instead,
  so setting only ``MILLM_API_KEYS`` never leaves management open.
- A missing or wrong key is ``401 invalid_api_key`` in OpenAI's shape.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Iterable
from urllib.parse import urlsplit

from .errors import MillmError
from .settings import Settings

log = logging.getLogger("millm.access")

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
#: Paths anyone who can reach the server may read: health, liveness, readiness and the API's description.
PUBLIC_PATHS = frozenset({"/api/health", "/api/health/live", "/api/health/ready", "/health", "/ping", "/openapi.json"})
#: Client routes outside ``/v1`` (vLLM's paths), guarded like ``/v1``: clients call them with API keys.
CLIENT_PATHS = frozenset({"/tokenize", "/detokenize"})
#: Routes whose body is a multipart form (file uploads), not JSON; a browser's cross-site form
#: still carries ``Origin``, so the origin check covers them.
MULTIPART_PATHS = frozenset({"/v1/files"})
#: The web UI's pages (``millm_webui``) and ``/`` (its redirect) hold no data of their own: a page is
#: rendered from calls on this API that carry the browser's key and are checked here like any other,
#: so without the key a page shows only the key form.
PAGE_PREFIX = "/ui"


class Unauthorized(MillmError):
    status, code = 401, "invalid_api_key"


class HostNotAllowed(MillmError):
    status, code = 400, "host_not_allowed"


class CrossOriginRefused(MillmError):
    status, code = 403, "cross_origin_refused"


class UnsupportedMediaType(MillmError):
    status, code = 415, "unsupported_media_type"


def is_loopback(host: str) -> bool:
    """``127.0.0.1``, ``::1``, ``localhost``: only this machine can connect."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split_host(value: str) -> tuple[str, str | None]:
    """``"Example.com:8000"`` → ``("example.com", "8000")``; ``"[::1]:80"`` → ``("[::1]", "80")``."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, None
        rest = value[end + 1 :]
        return value[: end + 1], rest[1:] if rest.startswith(":") else None
    if value.count(":") > 1:  # a bare IPv6 address, no port
        return f"[{value}]", None
    name, sep, port = value.partition(":")
    return name, port if sep else None


class Access:
    """The middleware. ``bind_host`` (the address ``millm serve`` listens on) is allowed as a Host too."""

    def __init__(self, settings: Settings, bind_host: str | None = None) -> None:
        self.api_keys = [k.encode() for k in settings["MILLM_API_KEYS"] or ()]
        self.admin_keys = [k.encode() for k in settings["MILLM_ADMIN_API_KEYS"] or ()]
        configured = settings["MILLM_ALLOWED_HOSTS"]
        hosts = list(configured) if configured else list(LOOPBACK_HOSTS)
        if bind_host and not configured and not _is_wildcard(bind_host):
            hosts.append(bind_host if ":" not in bind_host.strip("[]") else f"[{bind_host.strip('[]')}]")
        self.any_host = "*" in hosts
        self.hosts = {_split_host(h) for h in hosts if h != "*"}
        cors = settings["MILLM_CORS_ORIGINS"] or []
        self.cors_any = "*" in cors
        self.cors_origins = frozenset(o.rstrip("/") for o in cors if o != "*")

    # --- checks ---------------------------------------------------------------------
    def host_allowed(self, value: str | None) -> bool:
        if value is None or self.any_host:
            return True  # a client without Host (HTTP/1.0) is not a browser
        name, port = _split_host(value)
        return (name, None) in self.hosts or (name, port) in self.hosts

    def origin_allowed(self, origin: str, host: str | None) -> bool:
        origin = origin.strip().rstrip("/")
        if self.cors_any or origin in self.cors_origins:
            return True
        parts = urlsplit(origin)
        return host is not None and parts.scheme in ("http", "https") and parts.netloc.lower() == host.strip().lower()

    def keys_for(self, path: str) -> list[bytes] | None:
        """The keys that open ``path`` (None: open to all)."""
        if path in PUBLIC_PATHS or path == "/" or path == PAGE_PREFIX or path.startswith(PAGE_PREFIX + "/"):
            return None
        if path == "/v1" or path.startswith("/v1/") or path in CLIENT_PATHS:
            return self.api_keys + self.admin_keys if self.api_keys else None
        if self.admin_keys:
            return self.admin_keys
        return self.api_keys or None

    # --- Falcon ---------------------------------------------------------------------
    async def process_request(self, req, resp) -> None:
        host = req.get_header("Host")
        if not self.host_allowed(host):
            raise HostNotAllowed(
                f"Host {host!r} is not one this server answers to; add it to MILLM_ALLOWED_HOSTS", param="Host"
            )
        method = req.method
        if method == "OPTIONS":
            return  # a CORS preflight carries no credentials; it changes nothing
        keys = self.keys_for(req.path)
        if keys is not None:
            check_key(authorization(req), keys)
        if method in STATE_CHANGING:
            origin = req.get_header("Origin")
            if origin is not None and not self.origin_allowed(origin, host):
                raise CrossOriginRefused(
                    f"a state-changing request from origin {origin!r} is refused; "
                    "add the origin to MILLM_CORS_ORIGINS to allow it",
                    param="Origin",
                )
            if not (req.path in MULTIPART_PATHS and _is_multipart(req)):
                check_media_type(req)

    async def process_request_ws(self, req, ws) -> None:
        """A WebSocket is checked like a GET (Host, key), and by ``Origin`` too: a browser opens a
        socket across sites with no CORS preflight, so a page elsewhere must not read a feed."""
        host = req.get_header("Host")
        if not self.host_allowed(host):
            raise HostNotAllowed(f"Host {host!r} is not one this server answers to", param="Host")
        keys = self.keys_for(req.path)
        if keys is not None:
            check_key(req.get_header("Authorization"), keys)
        origin = req.get_header("Origin")
        if origin is not None and not self.origin_allowed(origin, host):
            raise CrossOriginRefused(f"a WebSocket from origin {origin!r} is refused", param="Origin")


def authorization(req) -> str | None:
    """``Authorization``, or Anthropic's ``X-Api-Key: <key>`` (what its SDKs send) read as ``Bearer <key>``."""
    value = req.get_header("Authorization")
    key = req.get_header("X-Api-Key")
    return f"Bearer {key}" if value is None and key else value


def _is_multipart(req) -> bool:
    return (req.get_header("Content-Type") or "").split(";")[0].strip().lower() == "multipart/form-data"


def check_key(authorization: str | None, keys: Iterable[bytes]) -> None:
    """401 unless ``Authorization: Bearer <key>`` carries one of ``keys`` (compared in constant time)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if not authorization or scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(
            "this server needs an API key: send Authorization: Bearer <key>", headers={"WWW-Authenticate": "Bearer"}
        )
    given = token.strip().encode("utf-8", "surrogateescape")
    if not any(hmac.compare_digest(given, key) for key in keys):
        raise Unauthorized("the API key is not valid here", headers={"WWW-Authenticate": "Bearer"})


def check_media_type(req) -> None:
    """415 unless the body is JSON; a request without a body may leave Content-Type out."""
    content_type = req.get_header("Content-Type")
    if content_type is None:
        has_body = req.get_header("Transfer-Encoding") is not None or (req.content_length or 0) > 0
        if not has_body:
            return
        raise UnsupportedMediaType(
            "a request body must be sent as Content-Type: application/json", param="Content-Type"
        )
    media = content_type.split(";")[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise UnsupportedMediaType(
            f"the request body must be application/json, not {media or 'empty'}", param="Content-Type"
        )


def _is_wildcard(host: str) -> bool:
    return host.strip("[]") in ("0.0.0.0", "::", "")


def exposure_warnings(settings: Settings, bind_host: str) -> list[str]:
    """What ``millm serve`` says, loudly, when it listens beyond this machine without keys."""
    if is_loopback(bind_host):
        return []
    warnings = []
    api, admin = settings["MILLM_API_KEYS"], settings["MILLM_ADMIN_API_KEYS"]
    if not api and not admin:
        warnings.append(
            f"listening on {bind_host} WITHOUT API KEYS: anyone who can reach this port can generate, "
            "load and unload models, register SAEs and arm probes. Set MILLM_API_KEYS and "
            "MILLM_ADMIN_API_KEYS."
        )
    elif not api:
        warnings.append(f"listening on {bind_host} without MILLM_API_KEYS: /v1 is open to anyone who can reach it")
    if _is_wildcard(bind_host) and not settings["MILLM_ALLOWED_HOSTS"]:
        warnings.append(
            "MILLM_ALLOWED_HOSTS is not set: requests that name this machine by anything but a "
            "loopback name are refused (400 host_not_allowed); list the names clients use"
        )
    return warnings
