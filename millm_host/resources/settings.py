"""``GET /api/settings``: every declared setting, as ``millm settings`` lists them (read-only).

Settings are environment variables read once at start, so this shows what is in force; a change
takes effect at the next start. Secrets are shown only as set or not, and a URL's password is hidden.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..openapi import operation
from ..protocol import ResponseModel

if TYPE_CHECKING:
    from ..settings import Settings


class SettingView(ResponseModel):
    name: str
    type: str
    value: Any
    default: Any
    help: str
    secret: bool
    #: Whether the environment set it (else the default is in force).
    set: bool


class SettingList(ResponseModel):
    object: str
    data: list[SettingView]


def _plain(value: Any) -> Any:
    """A JSON value: lists, numbers, booleans and strings as they are, anything else as text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _without_password(value: Any) -> Any:
    """``postgresql://user:pw@host/db`` → ``postgresql://user:***@host/db``."""
    if not isinstance(value, str) or "://" not in value:
        return value
    parts = urlsplit(value)
    if parts.password is None:
        return value
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class SettingsResource:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @operation("Every declared setting in force (secrets only as set or not)", response=SettingList)
    async def on_get(self, req, resp) -> None:
        settings = self.settings
        data = []
        for setting in settings.declared:
            value = settings[setting.name]
            is_set = settings.environ_has(setting.name)
            if setting.secret:
                value, default = bool(value), bool(setting.default)
            else:
                value, default = _without_password(_plain(value)), _plain(setting.default)
            data.append(
                {
                    "name": setting.name,
                    "type": setting.type.__name__,
                    "value": value,
                    "default": default,
                    "help": setting.help,
                    "secret": setting.secret,
                    "set": is_set,
                }
            )
        resp.media = {"object": "list", "data": data}
