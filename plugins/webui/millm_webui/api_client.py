"""The pages' one way to data: the server's own public HTTP API, called in process.

A page is rendered from what ``GET /api/...`` answers, through the same app, the same
middleware (Host check, keys) and the same responders as any client over HTTP: httpx's
ASGI transport on the host's Falcon app. So a page can never show what the API does not
offer, and a key the API refuses shows nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

#: The cookie the key form sets (``SameSite=Strict``): read here to call the API with it, and by
#: ``ui.js`` to send it as ``Authorization: Bearer``.
KEY_COOKIE = "millm_admin_key"


class NeedsKey(Exception):
    """The API answered 401: the page asks for the admin key instead of showing data."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Answer:
    status: int
    data: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def error(self) -> str:
        """The error's message, as the API's OpenAI-shaped body gives it."""
        if isinstance(self.data, dict) and isinstance(self.data.get("error"), dict):
            return str(self.data["error"].get("message") or "")
        return f"HTTP {self.status}"


class Api:
    """GETs on the server's own API, carrying the browser's Host and key."""

    def __init__(self, app: Any, req: Any) -> None:
        self.app = app
        headers = {"Accept": "application/json"}
        host = req.get_header("Host")
        if host:
            headers["Host"] = host
        key = req.cookies.get(KEY_COOKIE)
        if key:
            headers["Authorization"] = f"Bearer {unquote(key)}"
        self.headers = headers

    async def get(self, path: str, params: dict[str, Any] | None = None) -> Answer:
        """``GET path``; raises ``NeedsKey`` on 401, returns every other answer (errors included)."""
        import httpx  # here, not at the top: the server's start would pay for it on every restart

        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=60) as client:
            response = await client.get(path, params=params, headers=self.headers)
        try:
            data = response.json()
        except ValueError:
            data = response.text
        answer = Answer(response.status_code, data)
        if answer.status == 401:
            raise NeedsKey(answer.error)
        return answer

    async def data(self, path: str, params: dict[str, Any] | None = None, default: Any = None) -> Any:
        """The body of a successful answer, else ``default`` (a route a plugin does not serve, say)."""
        answer = await self.get(path, params)
        return answer.data if answer.ok else default
