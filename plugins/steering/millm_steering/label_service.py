"""What the ``/api/saes/{sae_id}/labels`` routes do: import an SAE's feature labels (from a file under
``MILLM_SAE_DIRS`` or an uploaded body), list and search them, and put a ``label`` beside the feature
indices of the other routes' answers (profiles, clusters, circuits, live values)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from millm_host.api import InvalidParameter, check_display_name, confined_path, list_page

from . import labels as files
from .labels import DUPLICATES, MODES, LabelFile, choice
from .store import label_json

if TYPE_CHECKING:
    from .service import SteeringService

#: The most labels one page lists, and how many by default.
PAGE_MAX, PAGE_DEFAULT = 1000, 100
#: The longest search text.
QUERY_MAX_CHARS = 200


class LabelService:
    """Feature labels of the registered SAEs."""

    def __init__(self, service: SteeringService) -> None:
        self.service = service
        self.store = service.store

    async def import_labels(self, sae_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Import from exactly one of ``path``, ``content`` or ``labels``; ``mode`` replace (default) or merge."""
        given = [key for key in ("path", "content", "labels") if body.get(key) is not None]
        if len(given) != 1:
            raise InvalidParameter(
                "send exactly one of path (a file under MILLM_SAE_DIRS), content (a file's text) or labels "
                "(a list of records)",
                param=given[1] if given else "path",
            )
        mode, duplicates = choice(body, "mode", MODES), choice(body, "duplicates", DUPLICATES)
        limit = self.service.host.settings["SAE_LABELS_MAX_BYTES"]
        source = given[0]
        value = body[source]
        if source == "labels":
            if not isinstance(value, list):
                raise InvalidParameter("labels must be a list of {index, description} records", param="labels")
        elif not isinstance(value, str) or not value:
            raise InvalidParameter(f"{source} must be a non-empty string", param=source)
        path = _labels_file(value, self.service.sae_dirs()) if source == "path" else None
        record = await asyncio.to_thread(self.store.sae, sae_id)
        neuronpedia_id = record.cfg.get("neuronpedia_id")

        def read() -> LabelFile:
            items: Iterable[Any]
            if source == "labels":
                items = value
            else:
                text = files.read_file(path, limit) if path is not None else files.check_content(value, limit)
                items = files.records(text)
            return files.read_labels(
                iter(items),
                d_sae=record.d_sae,
                sae_id=sae_id,
                neuronpedia_id=neuronpedia_id if isinstance(neuronpedia_id, str) else None,
                duplicates=duplicates,
            )

        found = await asyncio.to_thread(read)
        total = await asyncio.to_thread(self.store.store_labels, sae_id, found.labels, mode)
        self.service.labels.forget(sae_id)
        return {
            "sae_id": sae_id,
            "mode": mode,
            "imported": len(found.labels),
            "skipped_duplicates": found.skipped_duplicates,
            "formats": list(found.formats),
            "source": found.source,
            "labels": total,
        }

    async def delete_labels(self, sae_id: str) -> dict[str, Any]:
        deleted = await asyncio.to_thread(self.store.delete_labels, sae_id)
        self.service.labels.forget(sae_id)
        return {"sae_id": sae_id, "deleted": deleted}

    async def get_label(self, sae_id: str, index: str) -> dict[str, Any]:
        return label_json(await asyncio.to_thread(self.store.label, sae_id, _index(index, "index")))

    async def search(self, sae_id: str, text: str | None, limit: str | None, after: str | None) -> dict[str, Any]:
        """A page of the SAE's labels holding ``text`` (case-insensitive), in feature order."""
        if text is not None:
            if len(text) > QUERY_MAX_CHARS:
                raise InvalidParameter(f"q is longer than {QUERY_MAX_CHARS} characters", param="q")
            check_display_name(text, "q")
        size = PAGE_DEFAULT if limit is None else _index(limit, "limit")
        if not 1 <= size <= PAGE_MAX:
            raise InvalidParameter(f"limit is an integer from 1 to {PAGE_MAX}", param="limit")
        cursor = None if after is None else _index(after, "after")
        rows, more = await asyncio.to_thread(self.store.search_labels, sae_id, text, size, cursor)
        return list_page([label_json(r) for r in rows], has_more=more, id_key="index")

    async def annotate(self, groups: Iterable[tuple[str, list[dict[str, Any]]]]) -> None:
        """Put ``label`` beside each ``index`` of these feature lists, where the SAE has one (one
        database hop for all of them)."""
        groups = list(groups)
        wanted: dict[str, set[int]] = {}
        for sae_id, features in groups:
            wanted.setdefault(sae_id, set()).update(f["index"] for f in features)
        if not any(wanted.values()):
            return
        found = await asyncio.to_thread(self.store.labels_for, wanted)
        for sae_id, features in groups:
            mine = found.get(sae_id, {})
            for feature in features:
                label = mine.get(feature["index"])
                if label is not None:
                    feature["label"] = label


def _labels_file(value: str, roots: list[Path]) -> Path:
    """The file ``value`` names inside ``roots`` (``confined_path``'s rules); a relative name is the first
    root's that holds such a file (``confined_path`` prefers a directory)."""
    found = confined_path(value, roots, param="path", setting="MILLM_SAE_DIRS")
    if not found.is_file() and not Path(value).is_absolute():
        for root in roots:
            inside = confined_path(str(root / value), roots, param="path", setting="MILLM_SAE_DIRS")
            if inside.is_file():
                return inside
    return found


def _index(value: str, param: str) -> int:
    """A non-negative integer sent as text (a path segment or a query parameter)."""
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        raise InvalidParameter(f"{param} must be a non-negative integer, not {value!r}", param=param)
    return int(value)
