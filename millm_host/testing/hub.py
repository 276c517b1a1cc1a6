"""A Hugging Face Hub on 127.0.0.1 for tests: a real HTTP server answering the Hub API routes that
``huggingface_hub`` calls, from repositories that are directories under ``root``.

``root/<owner>/<name>/`` is the repo ``owner/name``; its files are the repo's files, and its tags
are the ``tags:`` of the YAML front matter of its ``README.md``, as on the Hub. Routes (what
``HfApi.list_models``, ``model_info``, ``list_repo_tree`` and ``hf_hub_download`` send):

- ``GET /api/models?filter=&search=&limit=`` the repos carrying every ``filter`` tag whose id
  contains ``search``;
- ``GET /api/models/{repo}`` (and ``/revision/{rev}``; ``blobs=true`` adds sizes): the repo's
  info with its ``siblings``;
- ``GET /api/models/{repo}/tree/{rev}[/{path}]``: its files;
- ``GET``/``HEAD /{repo}/resolve/{rev}/{path}``: a file, with ``X-Repo-Commit`` and ``ETag``.

A missing repo or file is ``404`` with the Hub's ``X-Error-Code``. ``fault`` makes every answer
fail one way (``"error"``: 503, ``"garbage"``: 200 with a body that is not JSON, ``"hang"``: no answer
until the hub stops); ``huge`` names files answered with bytes that never end. ``requests`` records
each request's method, path and headers.
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

DEFAULT_REVISION = "main"


class LocalHub:
    """``LocalHub(root).start()``; ``url`` is the endpoint to give ``huggingface_hub``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fault: str | None = None
        self.huge: set[str] = set()
        self.requests: list[dict[str, Any]] = []
        self.huge_bytes_sent = 0
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    # --- repos ----------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: dict[str, str | bytes], tags: list[str] | tuple[str, ...] = ()) -> Path:
        """Write a repo: ``files`` (path → content) and a README.md whose front matter lists ``tags``."""
        folder = self.root / repo_id
        folder.mkdir(parents=True, exist_ok=True)
        readme = "---\n" + yaml.safe_dump({"tags": list(tags)}) + "---\n# " + repo_id + "\n"
        for path, content in {"README.md": readme, **files}.items():
            target = folder / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
        return folder

    def repo_ids(self) -> list[str]:
        return sorted(
            f"{o.name}/{r.name}" for o in self.root.iterdir() if o.is_dir() for r in o.iterdir() if r.is_dir()
        )

    def files(self, repo_id: str) -> dict[str, Path]:
        folder = self.root / repo_id
        return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}

    def tags(self, repo_id: str) -> list[str]:
        text = (self.root / repo_id / "README.md").read_text(encoding="utf-8") if self.has_repo(repo_id) else ""
        if not text.startswith("---\n") or "\n---" not in text[4:]:
            return []
        found = yaml.safe_load(text[4 : text.index("\n---", 4)]) or {}
        return [str(t) for t in found.get("tags") or []]

    def has_repo(self, repo_id: str) -> bool:
        return repo_id.count("/") == 1 and ".." not in repo_id and (self.root / repo_id).is_dir()

    def commit(self, repo_id: str) -> str:
        """A stable 40-hex commit id of the repo's current files."""
        digest = hashlib.sha1()
        for path, file in self.files(repo_id).items():
            digest.update(path.encode() + b"\0" + file.read_bytes() + b"\0")
        return digest.hexdigest()

    # --- the server -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None, "start() the hub first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> LocalHub:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="local-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-answer (the size and timeout tests do) is not an error here


class _Handler(BaseHTTPRequestHandler):
    hub: LocalHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the tests read hub.requests
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        hub = self.hub
        url = urlsplit(self.path)
        hub.requests.append({"method": self.command, "path": self.path, "headers": dict(self.headers.items())})
        if hub.fault == "hang":
            hub._stopping.wait(120)
            return
        if hub.fault == "error":
            return self._send(503, b'{"error": "the hub is down for tests"}')
        if hub.fault == "garbage":
            return self._send(200, b"<html>not json{")
        query = parse_qs(url.query)
        path = unquote(url.path)
        if path == "/api/models":
            return self._json(self._search(query))
        if path.startswith("/api/models/"):
            return self._api_repo(path.removeprefix("/api/models/"), query)
        if "/resolve/" in path:
            repo_id, _, rest = path.strip("/").partition("/resolve/")
            _revision, _, file_path = rest.partition("/")
            return self._file(repo_id, file_path, head)
        self._send(404, b'{"error": "not a Hub route"}')

    # --- the API routes -------------------------------------------------------------------
    def _search(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        hub = self.hub
        wanted = query.get("filter", [])
        words = (query.get("search") or [""])[0].lower()
        limit = int((query.get("limit") or ["1000"])[0])
        found = []
        for repo_id in hub.repo_ids():
            tags = hub.tags(repo_id)
            if all(t in tags for t in wanted) and words in repo_id.lower():
                found.append(self._info(repo_id, siblings=False))
        return found[:limit]

    def _info(self, repo_id: str, *, siblings: bool, sizes: bool = False) -> dict[str, Any]:
        hub = self.hub
        info: dict[str, Any] = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": hub.commit(repo_id),
            "lastModified": "2026-11-30T12:00:00.000Z",
            "private": False,
            "gated": False,
            "downloads": 7,
            "likes": 1,
            "tags": hub.tags(repo_id),
        }
        if siblings:
            info["siblings"] = [
                {"rfilename": path, **({"size": file.stat().st_size} if sizes else {})}
                for path, file in hub.files(repo_id).items()
            ]
        return info

    def _api_repo(self, rest: str, query: dict[str, list[str]]) -> None:
        parts = rest.split("/")
        repo_id = "/".join(parts[:2])
        if not self.hub.has_repo(repo_id):
            return self._not_found("RepoNotFound", "Repository not found")
        tail = parts[2:]
        if not tail or tail[0] == "revision":
            sizes = (query.get("blobs") or ["false"])[0].lower() == "true"
            return self._json(self._info(repo_id, siblings=True, sizes=sizes))
        if tail[0] == "tree":
            under = "/".join(tail[2:])
            entries = [
                {
                    "type": "file",
                    "oid": hashlib.sha1(file.read_bytes()).hexdigest(),
                    "size": file.stat().st_size,
                    "path": p,
                }
                for p, file in self.hub.files(repo_id).items()
                if not under or p.startswith(under + "/")
            ]
            return self._json(entries)
        self._send(404, b'{"error": "not a Hub route"}')

    def _file(self, repo_id: str, file_path: str, head: bool) -> None:
        hub = self.hub
        if not hub.has_repo(repo_id):
            return self._not_found("RepoNotFound", "Repository not found")
        key = f"{repo_id}/{file_path}"
        if key in hub.huge:
            return self._endless()
        file = hub.files(repo_id).get(file_path)
        if file is None:
            return self._not_found("EntryNotFound", "Entry not found")
        body = file.read_bytes()
        headers = {"X-Repo-Commit": hub.commit(repo_id), "ETag": '"' + hashlib.sha1(body).hexdigest() + '"'}
        self._send(
            200, b"" if head else body, content_type="application/octet-stream", headers=headers, length=len(body)
        )

    def _endless(self) -> None:
        """A file whose bytes never end (no Content-Length): the reader must stop on its own."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunk = b"[" + b"0," * 32767 + b"0"
        try:
            while not self.hub._stopping.is_set():
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.hub.huge_bytes_sent += len(chunk)
        except OSError:  # the reader hung up
            pass

    # --- answers --------------------------------------------------------------------------
    def _json(self, value: Any) -> None:
        self._send(200, json.dumps(value).encode(), content_type="application/json")

    def _not_found(self, code: str, message: str) -> None:
        self._send(
            404, json.dumps({"error": message}).encode(), headers={"X-Error-Code": code, "X-Error-Message": message}
        )

    def _send(
        self,
        status: int,
        body: bytes,
        *,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if body:
            self.wfile.write(body)
