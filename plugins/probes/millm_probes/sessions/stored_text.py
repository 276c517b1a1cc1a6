"""Chat text as a text column can hold it, losslessly: a turn is never lost to a character the database refuses.

PostgreSQL's ``text`` refuses NUL, and no database driver can encode a lone
surrogate (JSON's ``"\\ud800"``) as UTF-8; either would fail the turn's write, and
the turn with it. ``store`` keeps such a text as a marker and its JSON string
(ASCII: every such character escaped); ``load`` gives back exactly the text that
was sent. Any other text is stored as it is (a text that happens to begin with
the marker is escaped too, so reading is never ambiguous).
"""

from __future__ import annotations

import json

MARK = "\x1bjson:"  # ESC is a character no chat text is expected to begin with


def storable(text: str) -> bool:
    """Whether ``text`` can go into a text column as it is (PostgreSQL's and SQLite's)."""
    if "\x00" in text or text.startswith(MARK):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def store(text: str | None) -> str | None:
    """``text`` as it is stored."""
    if text is None or storable(text):
        return text
    return MARK + json.dumps(text, ensure_ascii=True)


def load(stored: str | None) -> str | None:
    """The text ``store`` was given."""
    if stored is None or not stored.startswith(MARK):
        return stored
    return json.loads(stored[len(MARK) :])
