"""Browse Hub: anonymous, read-only reads of Hugging Face repos tagged ``mistudio-probe-definition``.

Built on ``huggingface_hub``: its shared HTTP session (and so ``HF_HUB_OFFLINE``), its anonymous
headers (``token=False``: no token is sent, even with ``HF_TOKEN`` set), its repo-id rules, its
``ModelInfo`` reading of an answer, and the URLs its ``HfApi`` uses (``list_models``, ``model_info``
with ``files_metadata``, ``hf_hub_url``) under ``PROBE_HUB_ENDPOINT``. Every request is bounded
here, which ``HfApi`` does not do: one attempt (its pagination retries five times with backoff and
waits out any ``Retry-After``), a timeout (the library sets none), and a byte cap counted while the
body streams, so an answer is never held whole before it is measured.

Everything here blocks: the routes call it in a worker thread.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx2  # huggingface_hub's HTTP client: its session answers with these types and errors
from huggingface_hub import ModelInfo, get_session, hf_hub_url
from huggingface_hub.utils import HFValidationError, build_hf_headers, validate_repo_id

from millm_host.api import InvalidParameter, check_display_name

from ..definition import RUNG_LANGUAGE
from ..errors import HubNotConfigured, HubNotFound, HubResponseTooLarge, HubTimeout, HubUnavailable

TAG = "mistudio-probe-definition"
SUFFIX = ".probe.json"
#: The repo's manifest, at its root: ``{"definitions": [{"filename": "x.probe.json", "rung": 2}, ...]}``.
MANIFEST = "manifest.json"
SEARCH_LIMIT_MAX = 50
QUERY_MAX_CHARS = 200
FILENAME_MAX_CHARS = 512
TAGS_SHOWN = 20
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
#: The Hub's answer for a repo or file anonymous reads cannot see (private and gated repos included).
_HIDDEN = {401, 403, 404}


# --- what a caller may name -------------------------------------------------------------
def check_repo_id(value: Any, param: str = "repo_id") -> str:
    """A Hub repo id (``owner/name`` or ``name``, ASCII), or ``400 invalid_parameter``."""
    if not isinstance(value, str) or not value:
        raise InvalidParameter(f"{param} is a Hub repo id such as owner/name", param=param)
    try:
        validate_repo_id(value)
    except HFValidationError as exc:
        raise InvalidParameter(f"{param} is not a valid Hub repo id: {exc}", param=param) from None
    if not value.isascii():
        raise InvalidParameter(
            f"{param} is not a valid Hub repo id: only ASCII letters, digits, -, _ and .", param=param
        )
    return value


def check_revision(value: Any, param: str = "revision") -> str | None:
    """None (the default branch) or a branch, tag or commit name, or ``400 invalid_parameter``."""
    if value is None:
        return None
    if not isinstance(value, str) or not _REVISION.match(value) or ".." in value or value.endswith("/"):
        raise InvalidParameter(f"{param} is a branch, tag or commit (letters, digits, . _ - /)", param=param)
    return value


def check_filename(value: Any, param: str = "filename") -> str:
    """A ``.probe.json`` path inside a repo (no ``..``, no leading ``/``, nothing hidden), or 400."""
    if not isinstance(value, str) or not value.endswith(SUFFIX) or len(value) > FILENAME_MAX_CHARS:
        raise InvalidParameter(
            f"{param} names a {SUFFIX} file of the repo (at most {FILENAME_MAX_CHARS} characters)", param=param
        )
    check_display_name(value, param)
    parts = value.split("/")
    if "\\" in value or any(part in ("", ".", "..") for part in parts):
        raise InvalidParameter(f"{param} is a path inside the repo: no '..', no empty part, no backslash", param=param)
    return value


def check_query(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if len(value) > QUERY_MAX_CHARS:
        raise InvalidParameter(f"q is at most {QUERY_MAX_CHARS} characters", param="q")
    return check_display_name(value, "q")


def check_endpoint(value: str) -> str:
    """``PROBE_HUB_ENDPOINT`` as an http(s) origin with an optional path, without a trailing slash."""
    parts = urlsplit(value or "")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise HubNotConfigured(f"PROBE_HUB_ENDPOINT={value!r} is not an http(s) URL such as https://huggingface.co")
    return value.rstrip("/")


# --- the client ---------------------------------------------------------------------------
@dataclass(frozen=True)
class HubClient:
    """Reads of one Hub endpoint, each within ``timeout_s`` and ``max_bytes``."""

    endpoint: str
    timeout_s: float
    max_bytes: int

    @classmethod
    def from_settings(cls, settings: Any) -> HubClient:
        return cls(
            endpoint=check_endpoint(settings["PROBE_HUB_ENDPOINT"]),
            timeout_s=settings["PROBE_HUB_TIMEOUT_S"],
            max_bytes=settings["MILLM_MAX_BODY_BYTES"],  # a definition from the Hub is held to a file import's size
        )

    def search(self, query: str | None, limit: int) -> dict[str, Any]:
        """Repos tagged ``mistudio-probe-definition`` whose id matches ``query`` (``list_models``'s URL)."""
        params: dict[str, Any] = {"filter": TAG, "limit": limit}
        if query:
            params["search"] = query
        answer = self._json(f"{self.endpoint}/api/models", params, "the search")
        if not isinstance(answer, list):
            raise HubUnavailable("the Hub's search answer is not a list of repos")
        repos, unlisted = [], 0
        for item in answer[:limit]:
            info = _model_info(item, "a search result")
            if not _valid_repo_id(info.id):
                unlisted += 1  # an id this server would refuse to open is not offered
                continue
            listed = info.tags if isinstance(info.tags, list) else []
            tags = [t for t in listed if isinstance(t, str) and len(t) <= 100][:TAGS_SHOWN]
            repos.append(
                {
                    "repo_id": info.id,
                    "author": info.author if isinstance(info.author, str) else None,
                    "downloads": info.downloads if isinstance(info.downloads, int) else None,
                    "likes": info.likes if isinstance(info.likes, int) else None,
                    "last_modified": info.last_modified.isoformat() if info.last_modified else None,
                    "tags": tags,
                }
            )
        return {"object": "list", "tag": TAG, "endpoint": self.endpoint, "data": repos, "unlisted": unlisted}

    def definitions(self, repo_id: str, revision: str | None) -> dict[str, Any]:
        """The repo's ``.probe.json`` files, each with its rung where the manifest states one."""
        url = f"{self.endpoint}/api/models/{repo_id}"
        if revision is not None:
            url += f"/revision/{quote(revision, safe='')}"
        info = _model_info(self._json(url, {"blobs": "true"}, f"the repo {repo_id}"), f"the repo {repo_id}")
        commit = info.sha if isinstance(info.sha, str) and _REVISION.match(info.sha) else revision
        files: dict[str, int | None] = {}
        unlisted = 0
        for sibling in info.siblings or []:
            name = sibling.rfilename
            if not isinstance(name, str) or not name.endswith(SUFFIX):
                continue
            if not _valid_filename(name):
                unlisted += 1
                continue
            files[name] = sibling.size if isinstance(sibling.size, int) else None
        has_manifest = any(s.rfilename == MANIFEST for s in info.siblings or [])
        manifest, rungs = self._manifest(repo_id, commit) if has_manifest else ({"status": "absent"}, {})
        data = []
        for name in sorted(files):
            rung = rungs.get(name)
            data.append(
                {
                    "filename": name,
                    "size": files[name],
                    "rung": rung,
                    "rung_stated": rung is not None,
                    "rung_language": RUNG_LANGUAGE[rung] if rung is not None else "rung not stated",
                }
            )
        return {
            "object": "probe.hub.repo",
            "repo_id": repo_id,
            "revision": commit,
            "manifest": manifest,
            "data": data,
            "unlisted": unlisted,
        }

    def download(self, repo_id: str, filename: str, revision: str | None) -> bytes:
        """One file's bytes (``hf_hub_url``'s resolve URL), at most ``max_bytes``; nothing is cached on disk."""
        url = hf_hub_url(repo_id, filename, revision=revision, endpoint=self.endpoint)
        return self._get(url, None, f"{filename} in {repo_id}")

    # --- the manifest ---------------------------------------------------------------------
    def _manifest(self, repo_id: str, revision: str | None) -> tuple[dict[str, Any], dict[str, int]]:
        """(what was found, filename → rung). A manifest this cannot read states no rung at all."""
        try:
            document = json.loads(self.download(repo_id, MANIFEST, revision))
        except HubNotFound:
            return {"status": "invalid", "reason": f"{MANIFEST} is listed but could not be read"}, {}
        except HubResponseTooLarge:
            return {"status": "invalid", "reason": f"{MANIFEST} is over {self.max_bytes} bytes"}, {}
        except (ValueError, RecursionError):
            return {"status": "invalid", "reason": f"{MANIFEST} is not JSON"}, {}
        entries = document.get("definitions") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            return {"status": "invalid", "reason": f'{MANIFEST} has no "definitions" list'}, {}
        rungs, ignored = {}, 0
        for entry in entries:
            name = entry.get("filename") if isinstance(entry, dict) else None
            rung = entry.get("rung") if isinstance(entry, dict) else None
            # bool is an int in Python; a rung of true is not a rung
            if isinstance(name, str) and isinstance(rung, int) and not isinstance(rung, bool) and rung in RUNG_LANGUAGE:
                rungs[name] = rung
            elif not (isinstance(entry, dict) and rung is None):
                ignored += 1
        found: dict[str, Any] = {"status": "found"}
        if ignored:
            found["ignored_entries"] = ignored  # an entry without a filename, or with a rung not 0–3
        return found, rungs

    # --- one bounded request --------------------------------------------------------------
    def _json(self, url: str, params: dict[str, Any] | None, what: str) -> Any:
        raw = self._get(url, params, what)
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            raise HubUnavailable(f"the Hub's answer for {what} is not JSON") from None

    def _get(self, url: str, params: dict[str, Any] | None, what: str) -> bytes:
        """The body of one GET: one attempt, ``timeout_s`` in all, at most ``max_bytes``."""
        deadline = time.monotonic() + self.timeout_s
        headers = build_hf_headers(token=False)  # anonymous: no token, whatever HF_TOKEN says
        try:
            with get_session().stream("GET", url, params=params, headers=headers, timeout=self.timeout_s) as response:
                if response.status_code in _HIDDEN:
                    code = response.headers.get("x-error-code") or str(response.status_code)
                    raise HubNotFound(
                        f"{what} is not on the Hub at {self.endpoint}, or is not public "
                        f"(Browse Hub reads anonymously) [{code[:40]}]"
                    )
                if response.status_code >= 400:
                    raise HubUnavailable(f"the Hub at {self.endpoint} answered HTTP {response.status_code} for {what}")
                declared = response.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > self.max_bytes:
                    raise HubResponseTooLarge(self._too_large(what))
                chunks, size = [], 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise HubResponseTooLarge(self._too_large(what))
                    if time.monotonic() > deadline:
                        raise HubTimeout(self._timed_out(what))
                    chunks.append(chunk)
                return b"".join(chunks)
        except httpx2.TimeoutException:
            raise HubTimeout(self._timed_out(what)) from None
        except httpx2.HTTPError as exc:  # refused, reset, DNS, a bad redirect
            raise HubUnavailable(f"could not reach the Hub at {self.endpoint} ({type(exc).__name__})") from None
        except OSError as exc:  # huggingface_hub's OfflineModeIsEnabled (HF_HUB_OFFLINE) among them
            raise HubUnavailable(f"could not reach the Hub at {self.endpoint}: {str(exc)[:200]}") from None

    def _too_large(self, what: str) -> str:
        return f"{what} is over {self.max_bytes} bytes (MILLM_MAX_BODY_BYTES, the limit a file import has)"

    def _timed_out(self, what: str) -> str:
        return f"the Hub at {self.endpoint} did not answer for {what} within {self.timeout_s:g} s (PROBE_HUB_TIMEOUT_S)"


def _model_info(item: Any, what: str) -> ModelInfo:
    """``item`` read as huggingface_hub reads a repo; an answer it cannot read is the Hub's fault (502)."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise HubUnavailable(f"the Hub's answer for {what} is not shaped like a repo")
    try:
        return ModelInfo(**item)
    except (TypeError, ValueError, KeyError, AttributeError):
        raise HubUnavailable(f"the Hub's answer for {what} is not shaped like a repo") from None


def _valid_repo_id(value: str) -> bool:
    try:
        check_repo_id(value)
    except InvalidParameter:
        return False
    return True


def _valid_filename(value: str) -> bool:
    try:
        check_filename(value)
    except InvalidParameter:
        return False
    return True
