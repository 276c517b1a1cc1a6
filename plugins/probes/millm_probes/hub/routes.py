"""Routes of Browse Hub (``/api/probes/hub/…``): search, one repo's definitions, import one.

Thin resources over ``browse.HubClient``: every Hub read runs in a worker thread (it blocks on the
network), at most ``HUB_IN_FLIGHT`` at once, so a Hub that hangs holds a few threads for at most
``PROBE_HUB_TIMEOUT_S`` and never the event loop or the rest of the thread pool. An import goes
through ``arming.manage.import_probe``, the checks a file import runs (identity digests, 409s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import falcon
from pydantic import BaseModel, ConfigDict, Field

from millm_host.api import InvalidParameter, MillmError, Param, operation, validate

from ..arming import manage
from ..errors import HubBusy
from ..routes import _Resource
from ..runtime import Runtime
from . import browse

#: Hub reads in flight at once (one more is 503 hub_busy): each holds a worker thread.
HUB_IN_FLIGHT = 4
T = TypeVar("T")


class HubImportRequest(BaseModel):
    """Which definition to import: a ``.probe.json`` of a repo, at a revision (the listing's commit)."""

    model_config = ConfigDict(extra="forbid")
    repo_id: Annotated[str, Field(min_length=1, max_length=96)]
    filename: Annotated[str, Field(min_length=1, max_length=browse.FILENAME_MAX_CHARS)]
    revision: Annotated[str, Field(max_length=128)] | None = None


class Hub(_Resource):
    """``GET /api/probes/hub/search``, ``GET /api/probes/hub/definitions``, ``POST /api/probes/hub/import``."""

    def __init__(self, runtime: Runtime) -> None:
        super().__init__(runtime)
        self.in_flight = 0

    async def _read(self, call: Callable[[browse.HubClient], T]) -> T:
        client = browse.HubClient.from_settings(self.host.settings)
        if self.in_flight >= HUB_IN_FLIGHT:
            raise HubBusy(f"{HUB_IN_FLIGHT} Hub reads are already running; try again shortly")
        self.in_flight += 1
        try:
            return await asyncio.to_thread(call, client)
        finally:
            self.in_flight -= 1

    @operation(
        "Search Hugging Face for repos tagged mistudio-probe-definition (anonymous, read-only)",
        query=[
            Param("q", {"type": "string", "maxLength": browse.QUERY_MAX_CHARS}, "Words the repo id contains"),
            Param("limit", {"type": "integer", "minimum": 1, "maximum": browse.SEARCH_LIMIT_MAX}, "Most repos (20)"),
        ],
        errors=(502, 503, 504),
    )
    async def on_get_search(self, req, resp) -> None:
        query = browse.check_query(req.get_param("q"))
        limit = _limit(req.get_param("limit"))
        resp.media = await self._read(lambda client: client.search(query, limit))

    @operation(
        "A Hub repo's .probe.json definitions, each with its rung from the repo's manifest or 'rung not stated'",
        query=[
            Param("repo_id", {"type": "string", "maxLength": 96}, "The repo (owner/name); required"),
            Param("revision", {"type": "string", "maxLength": 128}, "A branch, tag or commit (the default branch)"),
        ],
        errors=(404, 502, 503, 504),
    )
    async def on_get_definitions(self, req, resp) -> None:
        repo_id = browse.check_repo_id(req.get_param("repo_id"))
        revision = browse.check_revision(req.get_param("revision"))
        resp.media = await self._read(lambda client: client.definitions(repo_id, revision))

    @operation(
        "Import one definition from a Hub repo, through the checks a file import runs",
        request=HubImportRequest,
        status=201,
        errors=(404, 409, 502, 503, 504),
        query=[Param("on_conflict", {"enum": ["fail", "rename"]}, "What to do when the name exists (default fail)")],
    )
    async def on_post_import(self, req, resp) -> None:
        request = validate(HubImportRequest, await self.json(req))
        repo_id = browse.check_repo_id(request.repo_id)
        filename = browse.check_filename(request.filename)
        revision = browse.check_revision(request.revision)
        on_conflict = req.get_param("on_conflict") or "fail"
        if on_conflict not in ("rename", "fail"):  # before the download, not after it
            raise InvalidParameter(f"on_conflict must be rename or fail, not {on_conflict!r}", param="on_conflict")
        raw = await self._read(lambda client: client.download(repo_id, filename, revision))
        document = await self._definition(raw, filename)
        imported = await manage.import_probe(self.runtime, raw, document, on_conflict)
        source = {"endpoint": browse.HubClient.from_settings(self.host.settings).endpoint, "repo_id": repo_id}
        resp.media = {**imported, "hub": {**source, "filename": filename, "revision": revision}}
        resp.status = falcon.HTTP_201

    async def _definition(self, raw: bytes, filename: str) -> Any:
        """The file parsed as a file import's body is parsed, its refusal saying where the text came from."""
        try:
            return await self.parse_json(raw)
        except MillmError as exc:
            message = exc.message.replace("the request body", f"{filename} from the Hub")
            raise InvalidParameter(message, param="filename") from None


def _limit(raw: str | None) -> int:
    if raw is None:
        return 20
    if not raw.isdigit() or not 1 <= int(raw) <= browse.SEARCH_LIMIT_MAX:
        raise InvalidParameter(f"limit is an integer from 1 to {browse.SEARCH_LIMIT_MAX}", param="limit")
    return int(raw)


def install(runtime: Runtime, add_route) -> None:
    resource = Hub(runtime)
    add_route("/api/probes/hub/search", resource, suffix="search")
    add_route("/api/probes/hub/definitions", resource, suffix="definitions")
    add_route("/api/probes/hub/import", resource, suffix="import")
