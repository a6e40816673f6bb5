"""Turn a report into a complete SQLite export: find nsys, run `nsys export`, cache by content.

    ensure_sqlite(report) -> ExportResult(sqlite_path, exported_with, from_cache)

A `.sqlite` is used as given. For a `.nsys-rep` / `.qdrep`, a sibling `<stem>.sqlite` that is a
complete export of that same report is reused; otherwise nsys exports it into a cache keyed by the
report's content and the nsys version. Nothing is ever written next to the report.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sqlite3
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ...errors import NsysanError
from ..sqlite_file import EXPORTED_TABLES, FIRST_EXPORT_TABLES, connect_readonly, export_parameters, tables_missing, \
    tables_requested

# Split by stage; every name used outside stays importable from nsysan.sources.export.
from .input_files import REPORT_SUFFIXES, SQLITE_SIDE_FILES, _input_kind, describe_file_type, file_digest, \
    files_read_for, is_complete_export, open_regular, read_regular
from .nsys import INSTALL_GLOBS, _major_minor, _version_key, export_arguments, export_options, exports_tables, \
    find_nsys, nsys_version, report_version
from . import nsys_memo
from .run_nsys import _add_tables, _export_into, _export_timeout, part_path
from .sibling import _matching_sibling, sibling_mismatch



@dataclass(frozen=True)
class ExportResult:
    """Where the SQLite export of a report is, and how it got there."""

    sqlite_path: Path
    exported_with: str | None  # nsys version that made the cached export; None: given/sibling .sqlite
    from_cache: bool           # True when a cached export was reused without running nsys
    from_sibling: bool = False  # the report's own export beside it (<stem>.sqlite) was used


# ---------------------------------------------------------------------------------------------
# The cache


def resolve_cache_dir(cache_dir: Path | None = None) -> Path:
    """Return the export cache directory: `cache_dir`, $NSYSAN_CACHE_DIR,
    $XDG_CACHE_HOME/nsysan or ~/.cache/nsysan (in that order). It is not created here."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("NSYSAN_CACHE_DIR"):
        return Path(os.environ["NSYSAN_CACHE_DIR"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative path is invalid and must be ignored
        return Path(xdg) / "nsysan"
    return default_cache_dir()


def default_cache_dir(platform: str = sys.platform) -> Path:
    """~/.cache/nsysan on Linux (as always); elsewhere the platform's own cache folder
    (%LOCALAPPDATA%\\nsysan\\Cache on Windows, ~/Library/Caches/nsysan on macOS)."""
    if platform.startswith("linux"):
        return Path.home() / ".cache" / "nsysan"
    import platformdirs  # only off Linux, where it knows the folder's conventions

    return Path(platformdirs.user_cache_dir("nsysan", appauthor=False))


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold a lock on `lock_path`; a second analysis of the same report waits here.

    An flock where there is fcntl (Linux, macOS); filelock's lock on Windows, where there is no
    fcntl, and on a file system that takes no flock. (filelock everywhere cost the command 27 ms
    of imports, its asyncio support among them, while its export waited: issue 31.)"""
    try:
        import fcntl
    except ImportError:  # Windows
        fcntl = None
    if fcntl is not None:
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)  # read-write: a FIFO there can't block it
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError as err:
            os.close(descriptor)
            if err.errno not in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
        else:
            try:
                yield
            finally:
                os.close(descriptor)  # which releases the lock
            return
    import filelock

    with filelock.FileLock(lock_path):
        yield


def _remove_leftovers(cache: Path, key: str) -> None:
    """Delete temp files of an earlier export of `key` that was killed (SIGKILL, power loss)."""
    for leftover in [*cache.glob(f".{key}.*"), part_path(cache / f"{key}.sqlite")]:
        with contextlib.suppress(OSError):
            leftover.unlink()


# ---------------------------------------------------------------------------------------------
# The entry point


def ensure_sqlite(report: Path, *, nsys: str | Path | None = None, cache_dir: Path | None = None,
                  progress: Callable[[float], None] | None = None,
                  timeout_s: float | None = None, use_sibling: bool = True,
                  tables: Sequence[str] = EXPORTED_TABLES) -> ExportResult:
    """Return an SQLite export of `report` holding `tables` (default: every table nsysan reads),
    exporting it with nsys only when needed.

    A `.sqlite` is returned as given; a matching sibling `<stem>.sqlite` is reused (unless
    `use_sibling` is False: it turned out damaged) when it holds `tables`; otherwise the export
    comes from the cache (key: sha256 of the report + nsys version) when the tables it records
    cover `tables`, or is made into it: with `--tables` where that nsys has it, the tables
    already there included, so the entry only grows.
    `progress` gets fractions 0..1 while nsys runs. `timeout_s` (default $NSYSAN_EXPORT_TIMEOUT)
    bounds the nsys run. Every problem a user can cause raises NsysanError with one line.
    """
    report = Path(report)
    if _input_kind(report) == "sqlite":
        return ExportResult(report, exported_with=None, from_cache=False)
    sibling = _matching_sibling(report) if use_sibling else None
    # A sibling is read as a user's own export is, which must hold every table nsysan reads
    # (schema.refuse_missing_tables): only the cache knows how to add a table later.
    if sibling is not None and not tables_missing(recorded_tables(sibling), (*tables, *EXPORTED_TABLES)):
        return ExportResult(sibling, exported_with=None, from_cache=False, from_sibling=True)

    nsys_path = find_nsys(nsys, report=report)
    cache = resolve_cache_dir(cache_dir)
    # An nsys asked before (the same executable: path, size, mtime) is not asked again: its memo
    # in the cache says what it said, and the export starts once the report is hashed.
    probed = not nsys_memo.recall(nsys_path, cache)
    # Otherwise `nsys --version` and `nsys export --help` run while this thread hashes the report:
    # each is a wait (an nsys start, a read of the report) and the export needs all three; it
    # starts sooner (issue 31). The errors are the same, told in the same order: nsys's version
    # first, then the timeout setting, then the report; the help's never fails (export_options).
    with ThreadPoolExecutor(max_workers=2 if probed else 1, thread_name_prefix="nsysan-nsys-probe") as pool:
        version_later = pool.submit(nsys_version, nsys_path)
        options_later = pool.submit(export_options, nsys_path)
        try:
            digest, unreadable = file_digest(report), None
        except OSError as err:
            digest, unreadable = "", err
        version = version_later.result()
        timeout = _export_timeout(timeout_s)
        if unreadable is not None:
            raise NsysanError(f"can't read {report} ({unreadable.strerror}); check the file") from unreadable
        key = f"{digest}-nsys{re.sub(r'[^0-9A-Za-z.]', '_', version)}"
        options = options_later.result()
    # Exports with NVTX payloads are other files than the ones made before nsysan asked for them.
    key += "-blobs" if export_arguments(nsys_path) else ""
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise NsysanError(
            f"can't use the export cache at {cache} ({err.strerror}); "
            f"set NSYSAN_CACHE_DIR to a writable directory"
        ) from err
    if probed:
        nsys_memo.remember(nsys_path, cache, version, options)
    entry = cache / f"{key}.sqlite"
    if _covers(entry, tables):
        return ExportResult(entry, exported_with=version, from_cache=True)

    try:
        with _exclusive_lock(cache / f"{key}.lock"):
            # Another run may have finished this very export while we waited for the lock.
            if _covers(entry, tables):
                return ExportResult(entry, exported_with=version, from_cache=True)
            # An entry short of a table is given what it lacks (by nsys, where it exports some
            # tables: only those), so it then holds what it held and what is wanted.
            held = (recorded_tables(entry) or ()) if is_complete_export(entry) else ()
            wanted = tuple(dict.fromkeys([*held, *tables]))
            _remove_leftovers(cache, key)
            if held and exports_tables(nsys_path):
                exported = _add_tables(entry, held, wanted, report, nsys_path, version, progress, timeout)
            else:
                exported = _export_into(entry, report, nsys_path, version, progress, timeout, wanted)
            _write_record(entry, version, exported)
    except OSError as err:
        raise NsysanError(
            f"can't write the export cache at {cache} ({err.strerror}); "
            f"set NSYSAN_CACHE_DIR to a writable directory"
        ) from err
    return ExportResult(entry, exported_with=version, from_cache=False)


def remembered_nsys_version(nsys_path: Path, cache_dir: Path | None = None) -> str:
    """nsys_version, from the memo in the export cache when this nsys was asked before."""
    nsys_memo.recall(nsys_path, resolve_cache_dir(cache_dir))
    return nsys_version(nsys_path)


# ---------------------------------------------------------------------------------------------
# What a cached export holds

# Share of an analysis's progress bar taken by the export, when there is one.
EXPORT_SHARE = 0.6


def analysis_export(report: Path, *, nsys: str | Path | None, cache_dir: Path | None,
                    progress: Callable[[str, float], None], use_sibling: bool = True,
                    tables: Sequence[str] = FIRST_EXPORT_TABLES, stage: str = "exporting with nsys") -> ExportResult:
    """ensure_sqlite as an analysis asks for it (pipeline.analyze_report), its progress the first
    EXPORT_SHARE of the analysis's: the command line makes the first one itself, while the
    analyses are imported (commands/analyze.py)."""
    return ensure_sqlite(report, nsys=nsys, cache_dir=cache_dir, use_sibling=use_sibling, tables=tables,
                         progress=lambda f: progress(stage, f * EXPORT_SHARE))


def record_path(entry: Path) -> Path:
    """Where the cache records what the export `entry` holds: `<key>.tables.json` beside it."""
    return entry.with_suffix(".tables.json")


def _write_record(entry: Path, version: str, tables: tuple[str, ...] | None) -> None:
    """Record the nsys version and the tables (None: every one) of the export just put at
    `entry`. Written after the export is in place, whole (a temporary file renamed): a reader
    between the two sees the new export with the older record, which claims no more than it holds."""
    record = record_path(entry)
    tmp = record.with_name(f".{record.name}.tmp")
    tmp.write_text(json.dumps({"nsys": version, "tables": list(tables) if tables is not None else None}))
    os.replace(tmp, record)


def recorded_tables(export_path: Path) -> tuple[str, ...] | None:
    """The tables an export holds (names and patterns; None: every table): as the cache recorded
    them when it made the export, else as the export itself records its `--tables`."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        listed = json.loads(record_path(export_path).read_text())["tables"]
        return None if listed is None else tuple(str(name) for name in listed)
    try:
        with contextlib.closing(connect_readonly(export_path)) as conn:
            return tables_requested(export_parameters(conn))
    except sqlite3.DatabaseError:
        return ()  # unreadable: it holds nothing to count on


def lacks_tables(result: ExportResult, tables: Sequence[str]) -> bool:
    """Whether `result` is an export of nsysan's cache made without some of `tables`, which
    ensure_sqlite adds when asked. Any other export (a user's, a sibling) holds every table nsysan
    reads or is refused (schema.refuse_missing_tables)."""
    return result.exported_with is not None and bool(tables_missing(recorded_tables(result.sqlite_path), tables))


def _covers(entry: Path, tables: Sequence[str]) -> bool:
    """Whether `entry` is a complete export holding `tables`."""
    return is_complete_export(entry) and not tables_missing(recorded_tables(entry), tables)
