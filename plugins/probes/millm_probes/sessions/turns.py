"""Sessions: which conversation a monitored request belongs to, and which turn of it.

A client names its session with ``X-miLLM-Session``. Otherwise a chat request
that resends the conversation so far joins the session it continues: each turn
stores two hashes of its conversation through the reply (``exact_key``, and
``loose_key`` with the replies left out), and a request looks up the hashes of
its own messages up to the last assistant message. An exact match wins; a
rewritten reply still joins through the loose key when exactly one session
matches; two matches open a session of its own, marked ``ambiguous``. Only
hashes are compared, never text, and each lookup is one indexed query.

The session is settled in ``validate_request`` (a worker thread) so a stream's
headers can name it; the turn is written with the results, in ``after_generate``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from millm_host.api import MillmError, RequestContext

from . import stored_text
from .tables import ProbeSession, ProbeSessionTurn

SESSION_HEADER = "x-millm-session"
SESSION_ID_HEADER = "X-miLLM-Session-Id"
TRANSCRIPT_HEADER = "X-miLLM-Transcript"
log = logging.getLogger("millm.probes")

STATE = "probe_session"
#: Set on a monitored request that joins no session and keeps no text: ``PROBE_SESSIONS`` is off, or a judge called.
UNGROUPED = "probe_session_off"
MAX_LENGTH = 128
#: Requests that generate, and so may be monitored (scoring and embeddings never are).
MONITORED = frozenset({"chat.completions", "completions", "responses"})


class SessionIdInvalid(MillmError):
    status, code = 400, "SESSION_ID_INVALID"


def named_session(headers: dict[str, str]) -> str | None:
    """The ``X-miLLM-Session`` value: 1 to 128 printable ASCII characters, or 400 ``SESSION_ID_INVALID``."""
    raw = headers.get(SESSION_HEADER)
    if raw is None:
        return None
    if not 1 <= len(raw) <= MAX_LENGTH or not all(" " <= c <= "~" for c in raw):
        raise SessionIdInvalid(
            f"X-miLLM-Session must be 1 to {MAX_LENGTH} printable ASCII characters", param="X-miLLM-Session"
        )
    return raw


def judge_call(headers: dict[str, str]) -> bool:
    """A judge's own call (``X-miLLM-Origin: judge``): never user traffic, so never part of a conversation."""
    return headers.get("x-millm-origin", "").strip().lower() == "judge"


def now() -> datetime:
    return datetime.now(UTC)


def _aware(stamp: datetime) -> datetime:
    return stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)  # SQLite drops the zone


# --- conversation keys ------------------------------------------------------------------


def _digest(rows: list[tuple[str, str]]) -> str:
    data = json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(data.encode("utf-8", "surrogatepass")).hexdigest()


def keys(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """(exact, loose): hashes of the messages as (role, text), the loose one with every reply left out."""
    rows = [(str(m.get("role")), m.get("content") or "") for m in messages]
    loose = [(role, "" if role == "assistant" else text) for role, text in rows]
    return _digest(rows), _digest(loose)


def continuation_keys(conversation: list[dict[str, Any]]) -> tuple[str, str] | None:
    """The keys of the conversation so far: through its last assistant message (None: a first turn)."""
    last = max((i for i, m in enumerate(conversation) if m.get("role") == "assistant"), default=None)
    return None if last is None else keys(conversation[: last + 1])


# --- settling a request's session --------------------------------------------------------


@dataclass
class Claim:
    """The session a request joins (its row is written with the turn)."""

    session_id: str
    source: str  # header, prefix (continues a stored turn), new
    ambiguous: bool = False
    previous_session_id: str | None = None
    transcript: bool = False  # this turn's text is kept


def new_session_id() -> str:
    return "ses_" + secrets.token_hex(8)


def matching_sessions(db: Any, exact: str, loose: str) -> list[str]:
    """Sessions a stored turn of which the conversation continues: exact first, else with replies rewritten."""
    with db.engine.connect() as connection:
        for column, key in ((ProbeSessionTurn.exact_key, exact), (ProbeSessionTurn.loose_key, loose)):
            found = connection.scalars(
                sa.select(ProbeSessionTurn.session_id).where(column == key).distinct().limit(2)
            ).all()
            if found:
                return list(found)
    return []


def last_active(db: Any, session_id: str) -> datetime | None:
    with db.engine.connect() as connection:
        stamp = connection.scalar(sa.select(ProbeSession.last_active_at).where(ProbeSession.id == session_id))
    return _aware(stamp) if stamp is not None else None


def settle(db: Any, settings: Any, ctx: RequestContext) -> Claim:
    """The session this request joins (worker thread: reads the database)."""
    transcript = bool(settings["PROBE_TRANSCRIPTS"]) and ctx.endpoint == "chat.completions"
    named = named_session(ctx.headers)
    if named is not None:
        return Claim(named, "header", transcript=transcript)
    found = continuation_keys(ctx.conversations[0]) if ctx.conversations else None
    if found is None:
        return Claim(new_session_id(), "new", transcript=transcript)
    matches = matching_sessions(db, *found)
    if len(matches) > 1:
        return Claim(new_session_id(), "new", ambiguous=True, transcript=transcript)
    if not matches:
        return Claim(new_session_id(), "new", transcript=transcript)
    stamp = last_active(db, matches[0])
    idle = timedelta(minutes=settings["PROBE_SESSION_IDLE_MINUTES"])
    if stamp is not None and now() - stamp > idle:  # it ended: a new session, linked to it
        return Claim(new_session_id(), "prefix", previous_session_id=matches[0], transcript=transcript)
    return Claim(matches[0], "prefix", transcript=transcript)


# --- recording a turn ---------------------------------------------------------------------


def visible_reply(ctx: RequestContext) -> str:
    """The reply as the client sees it (a plugin may have replaced the content, e.g. with tool calls)."""
    if not ctx.outputs:
        return ""
    output = ctx.outputs[0]
    extras = output.message_extras or {}
    content = extras["content"] if "content" in extras else output.text
    return content or ""


def newest_user_message(conversation: list[dict[str, Any]]) -> str | None:
    return next((m.get("content") or "" for m in reversed(conversation) if m.get("role") == "user"), None)


class Sessions:
    """Writes turns: a turn number is the session's count plus one, counted in the database, so two
    replicas writing turns of one session at once get a turn number each."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.lock = threading.Lock()

    def record(self, ctx: RequestContext, claim: Claim, trace_id: str | None, fired: int) -> int:
        """Store the request as the claim's session's next turn; returns the turn number (engine thread)."""
        stamp = now()
        exact = loose = None
        user_text = reply_text = None
        if ctx.conversations:
            reply = visible_reply(ctx)
            exact, loose = keys([*ctx.conversations[0], {"role": "assistant", "content": reply}])
            if claim.transcript:
                user_text, reply_text = newest_user_message(ctx.conversations[0]), reply
        with self.lock, self.db.engine.begin() as connection:
            turn = self._next_turn(connection, claim, fired, stamp)
            connection.execute(
                sa.insert(ProbeSessionTurn).values(
                    session_id=claim.session_id,
                    turn=turn,
                    request_id=ctx.request_id,
                    trace_id=trace_id,
                    endpoint=ctx.endpoint,
                    exact_key=exact,
                    loose_key=loose,
                    created_at=stamp,
                    user_text=stored_text.store(user_text),  # NUL or a lone surrogate never loses the turn
                    reply_text=stored_text.store(reply_text),
                    transcript_at=stamp if claim.transcript else None,
                )
            )
        return turn

    @staticmethod
    def _next_turn(connection: Any, claim: Claim, fired: int, stamp: datetime) -> int:
        """Count the turn in the session's row (made by the first turn); its number."""
        bump = (
            sa.update(ProbeSession)
            .where(ProbeSession.id == claim.session_id)
            .values(turns=ProbeSession.turns + 1, fired=ProbeSession.fired + fired, last_active_at=stamp)
            .returning(ProbeSession.turns)
        )
        turn = connection.scalar(bump)  # the row is locked until commit: the next writer waits
        if turn is not None:
            return turn
        try:
            with connection.begin_nested():  # another replica may insert the session first
                connection.execute(
                    sa.insert(ProbeSession).values(
                        id=claim.session_id,
                        source=claim.source,
                        ambiguous=claim.ambiguous,
                        previous_session_id=claim.previous_session_id,
                        turns=1,
                        fired=fired,
                        started_at=stamp,
                        last_active_at=stamp,
                    )
                )
            return 1
        except sa.exc.IntegrityError:
            return connection.scalar(bump)


def headers(ctx: RequestContext) -> dict[str, str] | None:
    """``X-miLLM-Session-Id`` and ``X-miLLM-Transcript`` on a monitored response (a stream's too)."""
    claim = ctx.state.get(STATE)
    if claim is None:
        return {TRANSCRIPT_HEADER: "off"} if ctx.state.get(UNGROUPED) else None
    return {SESSION_ID_HEADER: claim.session_id, TRANSCRIPT_HEADER: "recorded" if claim.transcript else "off"}


def record_turn(runtime: Any, ctx: RequestContext, trace_id: str, results: list[dict[str, Any]]) -> tuple[Any, Any]:
    """Write the request's turn (when it joined a session); (session id, turn), or (None, None)."""
    claim = ctx.state.get(STATE)
    if claim is None:
        return None, None
    fired = sum(1 for r in results if r.get("fires") is True)
    try:
        return claim.session_id, runtime.sessions.record(ctx, claim, trace_id, fired)
    except Exception:  # a session that cannot be written never costs the request its results
        log.exception("recording the turn of session %s failed", claim.session_id)
        return claim.session_id, None
