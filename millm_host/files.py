"""Writing a directory so readers never see it half written."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def save_atomically(target: Path, save: Callable[[Path], None]) -> None:
    """``save(folder)`` into a staging folder beside ``target``, then rename it into place.

    When another process got there first, its ``target`` is kept.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        save(staging)
        try:
            os.replace(staging, target)
        except OSError:
            if not target.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
