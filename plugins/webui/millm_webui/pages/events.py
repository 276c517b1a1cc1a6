"""``/ui/probes/events/{result_id}``: one result in full, with its decoded window (the text around the
top-scoring token). With the transcript, the only page that shows prompt or reply text."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..render import Page


async def load(api, req, result_id: str) -> dict[str, Any]:
    answer = await api.get(f"/api/probes/events/{quote(result_id, safe='')}")
    return {"result": answer.data if answer.ok else None, "error": None if answer.ok else answer.error}


PAGE = Page("/ui/probes/events/{result_id}", None, "event.html", load)
