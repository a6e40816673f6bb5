"""Writing a cache file whole or not at all: what a cache keeps is a shortcut, never an error."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def keep_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temp file beside it and a rename, so that a reader sees the
    old file or the new one, never half of one; a folder or file that can't be written is let go."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(text.encode("utf-8"))
            os.replace(tmp_name, path)
        finally:
            with contextlib.suppress(OSError):  # gone once renamed
                os.unlink(tmp_name)
