"""The real tiktoken, offline: its cache filled from the vocabularies an installed package ships.

tiktoken downloads ``cl100k_base`` and ``o200k_base`` on first use; tests (and clients under
test, such as LangChain's ``OpenAIEmbeddings``) cannot reach the network. tiktoken first looks in
``TIKTOKEN_CACHE_DIR`` for a file named by the sha1 of the blob URL and checks its sha256, so
writing the bundled files there (``millm_host.tiktoken_vocab``, hash-checked) is enough.
The ``offline_tiktoken`` fixture (in ``millm_host.testing.fixtures``) sets this up for a session.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..tiktoken_vocab import NAMES, tiktoken_file

#: Where tiktoken downloads each vocabulary from (tiktoken_ext.openai_public).
BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"


def fill_tiktoken_cache(directory: Path) -> Path:
    """Write every bundled vocabulary into ``directory`` under the name tiktoken's cache gives it."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        key = hashlib.sha1(BLOB_URL.format(name=name).encode()).hexdigest()
        (directory / key).write_bytes(tiktoken_file(name))
    return directory


@contextmanager
def tiktoken_cache(directory: Path) -> Iterator[Path]:
    """``TIKTOKEN_CACHE_DIR`` pointed at a filled ``directory`` while the block runs, then restored."""
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(fill_tiktoken_cache(directory))
    try:
        yield directory
    finally:
        if before is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = before
