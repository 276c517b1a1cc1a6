"""``/ui/sessions`` (every session, no text) and ``/ui/sessions/{session_id}``: the timeline as a grid,
a row per turn and a column per behaviour, each cell coloured by its verdict; the transcript (the only
text here); delete, keeping the verdicts (detached) or deleting them too."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ..charts import session_strip
from ..render import Page
from ..verdicts import decided


def cell_verdict(results: list[dict[str, Any]]) -> str:
    """One cell's colour: fired if any result (a probe's or a rule's) fired, quiet if every one was
    judged and none fired, error when some result was not judged."""
    if not results:
        return "none"
    decisions = [decided(r) for r in results]
    if any(d is True for d in decisions):
        return "fired"
    if all(d is False for d in decisions):
        return "quiet"
    return "error"


async def load_list(api, req) -> dict[str, Any]:
    params = {"fired": req.get_param("fired")} if req.get_param("fired") in ("true", "false") else {}
    answer = await api.data("/api/probes/sessions", params, default={"data": []})
    return {"sessions": answer["data"], "fired": params.get("fired")}


async def load_one(api, req, session_id: str) -> dict[str, Any]:
    path = f"/api/probes/sessions/{quote(session_id, safe='')}"
    answer = await api.get(path)
    if not answer.ok:
        return {"session": None, "error": answer.error, "session_id": session_id}
    transcript = await api.get(path + "/transcript")
    return {
        "session": answer.data,
        "session_id": session_id,
        "api_path": path,
        "cell_verdict": cell_verdict,
        "strip": session_strip(answer.data, cell_verdict),
        "transcript": transcript.data.get("data", []) if transcript.ok else None,
        "transcript_error": None if transcript.ok else transcript.error,
    }


LIST = Page("/ui/sessions", "Sessions", "sessions.html", load_list, "conversations as timelines of verdicts")
ONE = Page("/ui/sessions/{session_id}", None, "session.html", load_one)
