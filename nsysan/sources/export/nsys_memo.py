"""What running nsys taught nsysan (its version, the options `nsys export --help` lists), kept in
the export cache per nsys executable, so that an analysis after the first with the same nsys starts
its export at once instead of after two nsys starts (issue 31: 0.1-0.2 s of every analysis).

A memo belongs to one executable (its resolved path, size and mtime) and to the code that reads
nsys's answers (a digest of nsys.py, stricter than nsysan's version, which an edit leaves as it
is). An nsys replaced or upgraded in place (another size or mtime) is asked again. A memo that can't be
read or is damaged is as if there were none; one that can't be written is not kept."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from ...base.keep import keep_text
from . import nsys as _nsys

# The cache's subfolder; one small JSON file per nsys executable.
MEMO_SUBDIR = "nsys-probes"
# Bumped when what is kept, or how it is read, changes.
_MEMO_FORMAT = 1


@functools.lru_cache(maxsize=1)
def _reader_digest() -> str:
    """sha256 of nsys.py, which turns what nsys prints into the version and options kept here."""
    try:
        return hashlib.sha256(Path(_nsys.__file__).read_bytes()).hexdigest()[:16]
    except OSError:  # no source beside the bytecode: the memo format alone tells the code apart
        return ""


def _identity(nsys: Path) -> dict[str, object] | None:
    """What makes two runs of `nsys` the same program; None when it can't be told (stat fails)."""
    try:
        resolved = os.path.realpath(nsys)
        stat = os.stat(resolved)
    except OSError:
        return None
    return {"format": _MEMO_FORMAT, "reader": _reader_digest(), "path": resolved,
            "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def memo_path(cache: Path, resolved: str) -> Path:
    return cache / MEMO_SUBDIR / f"{hashlib.sha256(resolved.encode('utf-8', 'surrogateescape')).hexdigest()[:32]}.json"


def recall(nsys: Path, cache: Path) -> bool:
    """Teach nsys.py what the memo for `nsys` in `cache` says; True when it held both answers."""
    identity = _identity(nsys)
    if identity is None:
        return False
    try:
        kept = json.loads(memo_path(cache, str(identity["path"])).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, unreadable, or not JSON (UnicodeDecodeError is a ValueError)
        return False
    if not isinstance(kept, dict) or kept.get("nsys") != identity:
        return False
    version, options = kept.get("version"), kept.get("export_options")
    if not (isinstance(version, str) and _nsys._is_version(version) and isinstance(options, list)
            and all(isinstance(option, str) for option in options)):
        return False
    _nsys.learned(nsys, version, frozenset(options))
    return True


def remember(nsys: Path, cache: Path, version: str, options: frozenset[str]) -> None:
    """Keep what `nsys --version` and `nsys export --help` said for the next analysis."""
    identity = _identity(nsys)
    if identity is None:
        return
    path = memo_path(cache, str(identity["path"]))
    text = json.dumps({"nsys": identity, "version": version, "export_options": sorted(options)}, sort_keys=True)
    keep_text(path, text)
