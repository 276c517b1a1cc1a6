"""OpenAI's list page (``{"object": "list", "data", "first_id", "last_id", "has_more"}``), for every paged route."""

from __future__ import annotations

from typing import Any


def page(data: list[dict[str, Any]], *, has_more: bool, id_key: str = "id") -> dict[str, Any]:
    """``data`` as one page; ``first_id``/``last_id`` are its items' ``id_key`` (the ``after`` cursor)."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0][id_key] if data else None,
        "last_id": data[-1][id_key] if data else None,
        "has_more": has_more,
    }
