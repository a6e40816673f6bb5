"""Turn a report into a complete SQLite export: find nsys, run `nsys export`, cache by content.

    ensure_sqlite(report) -> ExportResult(sqlite_path, exported_with, from_cache)

A `.sqlite` is used as given. For a `.nsys-rep` / `.qdrep`, a sibling `<stem>.sqlite` that is a
complete export of that same report is reused; otherwise nsys exports it into a cache keyed by the
report's content and the nsys version. Nothing is ever written next to the report.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import functools
import glob
import hashlib
import math
import os
import queue
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from nsysan.errors import NsysanError
from nsysan.schema import ExportIdentity, connect_readonly, export_identity, holds_complete_export
from nsysan.snapshot import live_writer, pending_state

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"
SQLITE_MAGIC = b"SQLite format 3\x00"

# Where installers put nsys, searched after --nsys, $NSYSAN_NSYS and $PATH. Each pattern's
# matches are tried newest version first. The Debian package installs /usr/bin/nsys ->
# /usr/lib/nsight-systems/bin/nsys -> ../target-linux-x64/nsys; NVIDIA's installers use
# /opt/nvidia/nsight-systems[-cli]/<version>/; CUDA toolkits ship it under /usr/local/cuda*;
# Nsight Compute bundles one under host/target-linux-x64.
INSTALL_GLOBS = (
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "/opt/nvidia/nsight-systems-cli/*/bin/nsys",
    "/opt/nvidia/nsight-systems-cli/*/target-linux-x64/nsys",
    "/usr/local/cuda*/bin/nsys",
    "/usr/local/cuda*/nsight-systems-*/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/lib/nsight-systems/target-linux-x64/nsys",
    "/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64/nsys",
    # Windows: the installer's default folder, one per version ("Nsight Systems 2025.3.2").
    "C:/Program Files/NVIDIA Corporation/Nsight Systems */target-windows-x64/nsys.exe",
    # macOS: the host application ships nsys beside nsys-ui (its target-linux-x64 is for Linux).
    "/Applications/NVIDIA Nsight Systems*.app/Contents/MacOS/nsys",
)
# What the binary is called inside an install directory given with --nsys or $NSYSAN_NSYS.
NSYS_NAMES = ("nsys", "nsys.exe")
INSTALL_SUBDIRS = ("", "bin", "target-linux-x64", "target-windows-x64", "Contents/MacOS")

# What SQLite keeps beside a database: the write-ahead log, its index, the rollback journal.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")

_HASH_CHUNK = 1 << 20
_VERSION_TIMEOUT_S = 60.0
_KEPT_OUTPUT_LINES = 40


@dataclass(frozen=True)
class ExportResult:
    """Where the SQLite export of a report is, and how it got there."""

    sqlite_path: Path
    exported_with: str | None  # nsys version that made the cached export; None: given/sibling .sqlite
    from_cache: bool           # True when a cached export was reused without running nsys
    from_sibling: bool = False  # the report's own export beside it (<stem>.sqlite) was used


# ---------------------------------------------------------------------------------------------
# Finding nsys


def find_nsys(explicit: str | Path | None = None, *, report: Path | None = None) -> Path:
    """Return the path of the nsys binary to use.

    Looks at `explicit` (the --nsys option), then $NSYSAN_NSYS (both may name the binary or an
    install directory holding `nsys`, `bin/nsys` or `target-linux-x64/nsys`), then $PATH, then
    INSTALL_GLOBS. `report` only makes the "not found" message name the file being read.
    """
    if explicit is not None and str(explicit) != "":
        return _nsys_at(Path(explicit).expanduser(), given_as=f"--nsys {explicit}")
    from_env = os.environ.get("NSYSAN_NSYS", "")
    if from_env:
        return _nsys_at(Path(from_env).expanduser(), given_as=f"NSYSAN_NSYS={from_env}")
    on_path = shutil.which("nsys")
    if on_path:
        return Path(on_path)
    for pattern in INSTALL_GLOBS:
        for candidate in sorted(glob.glob(pattern), key=_numbers_in, reverse=True):
            if _is_executable(Path(candidate)):
                return Path(candidate)
    name = report.name if report is not None else "<report>"
    raise NsysanError(
        f"Nsight Systems' nsys is needed to read {name}; install it, or pass --nsys PATH, "
        f"or export a .sqlite yourself with `nsys export --type sqlite {name}`"
    )


def _nsys_at(path: Path, given_as: str) -> Path:
    """The nsys binary at `path` (a binary or an install directory), or an error naming it."""
    candidates = [path / sub / name for sub in INSTALL_SUBDIRS for name in NSYS_NAMES]
    for candidate in candidates if path.is_dir() else [path]:
        if _is_executable(candidate):
            return candidate
    raise NsysanError(
        f"{given_as}: no runnable nsys there; point it at the nsys binary or at the "
        f"Nsight Systems install directory"
    )


def _is_executable(path: Path) -> bool:
    # Windows has no execute bit: os.access(X_OK) is true for any file there, as wanted.
    return path.is_file() and os.access(path, os.X_OK)


def _numbers_in(text: str) -> tuple[int, ...]:
    """All integers in `text`, for sorting versioned install paths newest first."""
    return tuple(int(n) for n in re.findall(r"\d+", text))


@functools.lru_cache(maxsize=None)
def nsys_version(nsys: Path) -> str:
    """Return the version of the nsys at `nsys`, e.g. "2022.4.2.1" (from `nsys --version`)."""
    try:
        done = subprocess.run(
            [str(nsys), "--version"], stdin=subprocess.DEVNULL, capture_output=True,
            timeout=_VERSION_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise NsysanError(
            f"could not run `{nsys} --version` ({err}); check --nsys / NSYSAN_NSYS"
        ) from err
    text = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    # "NVIDIA Nsight Systems version 2022.4.2.1-df9881f"
    match = re.search(r"version\s+(\d{4}\.\d+\.\d+(?:\.\d+)?)", text)
    if match is None:
        raise NsysanError(
            f"`{nsys} --version` printed no Nsight Systems version; point --nsys at Nsight Systems' nsys"
        )
    return match.group(1)


@functools.lru_cache(maxsize=None)
def export_options(nsys: Path) -> frozenset[str]:
    """The long options `nsys export --help` lists ("include-blobs", "lazy", ...), read once per nsys.

    Newer options are passed only where they exist: an unknown option fails the whole export.
    An nsys whose help can't be read gets none of them.
    """
    try:
        done = subprocess.run(
            [str(nsys), "export", "--help"], stdin=subprocess.DEVNULL, capture_output=True,
            timeout=_VERSION_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    text = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    return frozenset(re.findall(r"(?<![\w-])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)", text))


def export_arguments(nsys: Path) -> list[str]:
    """What nsysan adds to `nsys export --type sqlite`: `--include-blobs true` where that nsys
    knows it, because without it the export drops NVTX payloads, and with them the Python call
    stacks of `--python-backtrace=cuda` (2022.4 has no such option and no such stacks)."""
    return ["--include-blobs", "true"] if "include-blobs" in export_options(nsys) else []


# ---------------------------------------------------------------------------------------------
# Which Nsight Systems wrote a report

_HEADER_VERSION = re.compile(rb"^NVIDIA Tegra Profiler Report (\d{4})@(\d+)@(\d+)@(\d+)")
# The session record at the end of a report holds the product version as a length-prefixed
# protobuf string (field 6, tag byte 0x32): b"2\x122022.4.2.1-df9881f", b"2\n2025.3.1.0".
_TRAILER_VERSION = re.compile(
    rb"\x32([\x05-\x40])((\d{4}\.\d{1,2}\.\d{1,2}(?:\.\d{1,6})?)(?:-[0-9A-Za-z]+)?)"
)
# Fallback: a build string anywhere, "2021.2.1.58-642947b" or "2024.2.3.38-242334140272v0".
_BUILD_STRING = re.compile(
    rb"(?<![\d.])(20\d\d\.\d{1,2}\.\d{1,2}\.\d{1,6})-(?:[0-9a-f]{7}|\d{12}v\d)"
)
_HEAD_BYTES = 4 << 20
_TAIL_BYTES = 1 << 20


def report_version(report: Path) -> str | None:
    """Return the Nsight Systems version that captured a .nsys-rep/.qdrep, as "YYYY.M.P[.B]".

    Reads at most the first 4 MiB and the last 1 MiB. Reports from 2023.3.3 on name the version
    in their first line (`... Report 2024@2@3@38-...`); older ones (`Report 1.`) and 2025.3
    (`Report 36398880.`) keep it in the session record at the end of the file. Returns None
    when the file is unreadable, is not a report, or names no version.
    """
    ends = _report_ends(report)
    if ends is None:
        return None
    head, tail = ends
    header = _HEADER_VERSION.match(head)
    if header:
        return ".".join(str(int(part)) for part in header.groups())
    trailer = [m for m in _TRAILER_VERSION.finditer(tail) if m.group(1)[0] == len(m.group(2))]
    if trailer:
        return trailer[-1].group(3).decode("ascii")
    build = _BUILD_STRING.search(tail) or _BUILD_STRING.search(head)
    return build.group(1).decode("ascii") if build else None


def _report_ends(report: Path) -> tuple[bytes, bytes] | None:
    """The first 4 MiB and the last 1 MiB of a report, or None when it is no readable report."""
    try:
        with open_regular(report) as handle:  # a FIFO or a device could block forever
            head = handle.read(_HEAD_BYTES)
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - _TAIL_BYTES))
            tail = handle.read(_TAIL_BYTES)
    except OSError:
        return None
    return (head, tail) if head.startswith(REPORT_MAGIC) else None


def _is_version(text: str) -> bool:
    return re.fullmatch(r"\d+(\.\d+)*", text) is not None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


# ---------------------------------------------------------------------------------------------
# Opening files without blocking on special ones

_FILE_TYPES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def describe_file_type(mode: int) -> str:
    """"a FIFO (named pipe)", "a character device", ... for a file that is not a regular one."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")


# Flags of an open that never waits (O_NONBLOCK), never becomes the controlling terminal, and
# reads bytes as they are (O_BINARY: Windows). The ones a platform lacks are left out.
_NO_WAITING = (getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def open_regular(path: Path) -> BinaryIO:
    """Open `path` for reading when it is a regular file; OSError(EINVAL) saying what it is if not.

    O_NONBLOCK: opening a FIFO for reading would wait forever for a writer, and reading a
    terminal or a socket for a reader that never comes; the type is checked on the open file.
    """
    fd = os.open(path, os.O_RDONLY | _NO_WAITING)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"it is {describe_file_type(mode)}, not a file", str(path))
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


# ---------------------------------------------------------------------------------------------
# Checking SQLite files


def is_complete_export(path: Path) -> bool:
    """Return True when `path` is a SQLite file holding a whole nsys export, not a leftover.

    True needs at least one of schema.COMPLETE_EXPORT_TABLES; a file with only StringIds and
    ProcessStreams is what a failed nsys export leaves behind, and a file shorter than its
    header says is what a full disk or an interrupted copy leaves behind.
    """
    path = Path(path)
    if not path.is_file() or sqlite_truncation(path) is not None:
        return False
    try:
        with contextlib.closing(connect_readonly(path)) as conn:
            return holds_complete_export(conn)
    except sqlite3.DatabaseError:
        return False


def sqlite_truncation(path: Path) -> str | None:
    """Why the SQLite file at `path` is cut short ("holds N of its M bytes"), or None if it is whole.

    SQLite only ever writes whole pages, and its header records the page size (bytes 16-17) and,
    when bytes 92-95 match the change counter at 24-27, the page count (bytes 28-31). A copy or
    an export cut short by a full disk still opens, and its first pages (the table list) read
    fine, so only the size tells it apart before a query fails half-way or, worse, a lost page
    silently drops rows.
    """
    try:
        with open_regular(path) as handle:
            header = handle.read(100)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return None
    if len(header) < 100 or not header.startswith(SQLITE_MAGIC):
        return None
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return None  # not a page size SQLite writes; let SQLite itself say what is wrong
    pages = int.from_bytes(header[28:32], "big")
    expected = pages * page_size if pages and header[24:28] == header[92:96] else None
    if expected is not None and size < expected:
        return f"holds {size} of its {expected} bytes"
    if size % page_size:
        return f"ends in the middle of a page ({size} bytes, pages of {page_size})"
    return None


def _export_identity(sqlite_path: Path) -> ExportIdentity | None:
    """What the export at `sqlite_path` records about its input, or None when it can't be read."""
    try:
        with contextlib.closing(connect_readonly(sqlite_path)) as conn:
            return export_identity(conn)
    except sqlite3.DatabaseError:
        return None


def _second_of(text: object) -> datetime.datetime | None:
    """"2026-11-29T18:10:59" (also with a zone after it) as a naive datetime, or None."""
    try:
        return datetime.datetime.strptime(str(text)[:19], "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None


# The session record at the end of a report (protobuf): field 2 is the session's UUID, field 4
# its start as text, on the capture machine's clock, to the second: b'\x12$<uuid>"\x132026-11-29T18:10:59'.
# The export writes the same moment into TARGET_INFO_SESSION_START_TIME as utcTime and localTime
# (seen 1 s apart from it in a 2022.4 export, rounded differently).
_SESSION_START = re.compile(rb'\x12\x24[0-9a-f-]{36}"\x13(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)')
_START_SLACK = datetime.timedelta(seconds=2)


def report_session_start(report: Path) -> datetime.datetime | None:
    """When the capture in a .nsys-rep/.qdrep started (capture machine's clock), or None."""
    ends = _report_ends(report)
    if ends is None:
        return None
    head, tail = ends
    found = list(_SESSION_START.finditer(tail)) or list(_SESSION_START.finditer(head))
    return _second_of(found[-1].group(1).decode("ascii")) if found else None


def sibling_mismatch(report: Path, sibling: Path) -> str | None:
    """Why `sibling` is not provably the export of `report` ("records the input x.nsys-rep"), or
    None when it is: a complete export, no older than the report, whose recorded input is the
    report's name, whose session started when the report's did, and made by an nsys at least as
    new as the one that captured the report. A name and a time alone prove nothing: a newer
    run.sqlite of another capture may sit beside run.nsys-rep."""
    try:
        found = os.stat(sibling)
        if not stat.S_ISREG(found.st_mode):
            return f"is {describe_file_type(found.st_mode)}, not a file"
        # An export older than the report belongs to an earlier capture under the same name.
        if found.st_mtime_ns < os.stat(report).st_mtime_ns:
            return "is older than the report"
    except OSError as err:
        return f"can't be read ({err.strerror})"
    if pending_state(sibling) is not None or live_writer(sibling) is not None:
        return "has a write-ahead log, a journal or a writer: it is not a finished export"
    if not is_complete_export(sibling):
        return "is not a complete nsys export"
    identity = _export_identity(sibling)
    if identity is None:
        return "can't be read"
    if identity.input_name != report.name:
        return f"records another input ({identity.input_name or 'none'})"
    started = report_session_start(report)
    recorded = [t for t in map(_second_of, identity.session_starts) if t is not None]
    if started is None or not any(abs(t - started) <= _START_SLACK for t in recorded):
        return "records another capture's start time (or none)"
    captured = report_version(report)
    if captured and identity.exporter_version and _is_version(identity.exporter_version) and \
            _version_key(identity.exporter_version)[:2] < _version_key(captured)[:2]:
        return f"was exported by nsys {identity.exporter_version}, older than the report ({captured})"
    return None


def _matching_sibling(report: Path) -> Path | None:
    """`<stem>.sqlite` next to `report` when it is provably a complete export of this very report."""
    sibling = report.with_suffix(".sqlite")
    if not os.path.lexists(sibling):
        return None
    return sibling if sibling_mismatch(report, sibling) is None else None


def files_read_for(report: Path) -> list[Path]:
    """Every file an analysis of `report` may read: the report, the sibling export of a report,
    and the files SQLite keeps beside a database (-wal, -journal, -shm). No output may replace
    one of them."""
    report = Path(report)
    databases = [report]
    if report.suffix.lower() in REPORT_SUFFIXES:
        databases.append(report.with_suffix(".sqlite"))
    side = [Path(f"{db}{tail}") for db in databases for tail in SQLITE_SIDE_FILES]
    return [*databases, *side]


# ---------------------------------------------------------------------------------------------
# Checking the input


def _input_kind(path: Path) -> str:
    """Return "sqlite" or "report" for a readable input, or raise NsysanError saying what is wrong."""
    if not path.exists():
        raise NsysanError(f"{path}: no such file; check the path")
    if path.is_dir():
        raise NsysanError(f"{path} is a directory; pass one .nsys-rep, .qdrep or .sqlite file")
    suffix = path.suffix.lower()
    if suffix == ".qdstrm":
        raise NsysanError(
            f"{path} is an unfinished capture (.qdstrm); import it first with QdstrmImporter from "
            f"the Nsight Systems version that captured it (QdstrmImporter -i {path.name}), "
            f"then analyze the .nsys-rep it writes"
        )
    if suffix not in (*REPORT_SUFFIXES, ".sqlite"):
        raise NsysanError(
            f"{path}: nsysan reads .nsys-rep, .qdrep and .sqlite files from Nsight Systems, "
            + (f"not {suffix} files" if suffix else "so give the file the suffix it was written with")
        )
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):  # checked before opening: opening a FIFO waits for a writer
            raise NsysanError(f"{path} is {describe_file_type(mode)}, not a file; nsysan reads report files "
                              "(.nsys-rep, .qdrep, .sqlite), so pass the file itself, not a pipe or a device")
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(len(REPORT_MAGIC))
    except OSError as err:
        raise NsysanError(f"can't read {path} ({err.strerror}); check its permissions") from err
    if size == 0:
        raise NsysanError(
            f"{path} is empty (0 bytes); the capture or the copy was cut short, so copy or capture it again"
        )
    if suffix == ".sqlite":
        if not head.startswith(SQLITE_MAGIC):
            raise NsysanError(
                f"{path} is not a SQLite file; pass an export made by `nsys export --type sqlite`"
            )
        cut = sqlite_truncation(path)
        if cut is not None:
            raise NsysanError(
                f"{path} is truncated: it {cut}; the copy or the export was cut short, "
                f"so copy or export it again"
            )
        return "sqlite"
    if not head.startswith(REPORT_MAGIC):
        raise NsysanError(
            f"{path} is not an Nsight Systems report (it lacks the report header); "
            f"check that the file was copied whole"
        )
    return "report"


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


def _content_digest(path: Path) -> str:
    """sha256 of the file's bytes, read in chunks so large reports stay out of memory."""
    digest = hashlib.sha256()
    with open_regular(path) as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold a lock on `lock_path`; a second analysis of the same report waits here.

    filelock takes an flock on Linux and macOS and a msvcrt lock on Windows, where there is
    no fcntl."""
    import filelock

    with filelock.FileLock(lock_path):
        yield


def _remove_leftovers(cache: Path, key: str) -> None:
    """Delete temp files of an earlier export of `key` that was killed (SIGKILL, power loss)."""
    for leftover in cache.glob(f".{key}.*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


# Beyond this a timeout means "no limit" (and a deadline this far off would overflow select()).
MAX_TIMEOUT_S = 365 * 24 * 3600.0


def _export_timeout(timeout_s: float | None) -> float | None:
    """Seconds an export may take: `timeout_s`, else $NSYSAN_EXPORT_TIMEOUT, else None (no
    limit). 0, a negative number, inf or more than a year mean no limit; a value that is no
    number (nan, "ten") is one clear line."""
    if timeout_s is None:
        raw = os.environ.get("NSYSAN_EXPORT_TIMEOUT", "").strip()
        if not raw:
            return None
        try:
            timeout_s = float(raw)
        except ValueError:
            timeout_s = math.nan
        if math.isnan(timeout_s):
            raise NsysanError(
                f"NSYSAN_EXPORT_TIMEOUT={raw!r} is not a number of seconds; set it to e.g. 600, or unset it"
            )
    return timeout_s if 0 < timeout_s <= MAX_TIMEOUT_S else None


# ---------------------------------------------------------------------------------------------
# Running nsys export

_PERCENT = re.compile(r"(\d{1,3})%")


class _NsysOutput:
    """Reads nsys's merged stdout/stderr: reports `Exporting N events: [..37%..]` progress
    (redrawn with carriage returns) and keeps the last lines to quote on failure."""

    def __init__(self, progress: Callable[[float], None] | None) -> None:
        self._progress = progress
        self._pending = b""
        self.last_fraction: float | None = None
        self.lines: deque[str] = deque(maxlen=_KEPT_OUTPUT_LINES)

    def feed(self, chunk: bytes) -> None:
        *complete, self._pending = re.split(rb"[\r\n]", self._pending + chunk)
        for raw in complete:
            self._take(raw.decode("utf-8", "replace").strip())

    def close(self) -> None:
        self._take(self._pending.decode("utf-8", "replace").strip())
        self._pending = b""

    def _take(self, line: str) -> None:
        if not line:
            return
        percent = _PERCENT.search(line) if "[" in line else None
        if percent is None:
            self.lines.append(line)
            return
        fraction = min(int(percent.group(1)), 100) / 100
        if self._progress is not None and fraction != self.last_fraction:
            self._progress(fraction)
        self.last_fraction = fraction


def _run_nsys(command: list[str], output: _NsysOutput, timeout_s: float | None) -> int:
    """Run `command` in its own process group, feeding its output to `output` as it comes.

    Returns the exit code (negative: killed by that signal). Raises TimeoutError after
    `timeout_s`; on that, on Ctrl-C or on any error the whole group is killed.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def remaining() -> float | None:
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    # A new session (a new process group on Windows): nsys (and anything it spawns) can be killed
    # as one group, and a Ctrl-C in the terminal reaches only us, so the `finally` below decides
    # what happens to nsys.
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0),
    )
    try:
        assert process.stdout is not None
        chunks = _pump(process.stdout.fileno())
        while True:
            try:
                # In slices of a second: on Windows a wait without a timeout ignores Ctrl-C.
                left = remaining()
                chunk = chunks.get(timeout=1.0 if left is None else min(left, 1.0))
            except queue.Empty:
                continue
            if not chunk:
                break
            output.feed(chunk)
        output.close()
        try:
            return process.wait(timeout=remaining())
        except subprocess.TimeoutExpired:
            raise TimeoutError from None
    finally:
        if process.poll() is None:  # still ours and not reaped, so its group id is still its pid
            with contextlib.suppress(ProcessLookupError):
                if hasattr(os, "killpg"):
                    os.killpg(process.pid, signal.SIGKILL)
                else:  # Windows: no process groups to signal
                    process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def _pump(fd: int) -> "queue.Queue[bytes]":
    """Read `fd` on a thread until its end, which is queued as b"". A thread rather than a
    selector, because select() on Windows waits on sockets only, never on a pipe."""
    chunks: queue.Queue[bytes] = queue.Queue()

    def read_all() -> None:
        try:
            while chunk := os.read(fd, 65536):
                chunks.put(chunk)
        except OSError:  # the pipe was closed under us: the process is gone
            pass
        finally:
            chunks.put(b"")

    threading.Thread(target=read_all, name="nsys-output", daemon=True).start()
    return chunks


def _error_line(lines: deque[str]) -> str:
    """nsys's own error line (never the rest of its output, which may echo the environment)."""
    for marker in ("exportation error", "error", "exception", "fail"):
        for line in reversed(lines):
            if marker in line.lower():
                return _one_line(line)
    return "(nsys printed no error line)"


def _one_line(text: str, limit: int = 300) -> str:
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _too_new(report: Path, nsys: Path, nsys_ver: str) -> NsysanError:
    captured = report_version(report)
    found = f"{nsys_ver} at {nsys}"
    export_there = f"export it where it was captured: nsys export --type sqlite {report.name}"
    if captured is None:
        return NsysanError(
            f"{report.name} comes from a newer Nsight Systems than the nsys found ({found}), which "
            f"can't export it; point --nsys at a newer Nsight Systems, or {export_there}"
        )
    wanted = _major_minor(captured)
    return NsysanError(
        f"{report.name} comes from Nsight Systems {wanted}, and the nsys found ({found}) can't "
        f"export it; point --nsys at Nsight Systems {wanted} or newer, or {export_there}"
    )


def _export_failed(report: Path, nsys: Path, nsys_ver: str, returncode: int,
                   lines: deque[str]) -> NsysanError:
    """The NsysanError for an nsys export that exited non-zero."""
    text = "\n".join(lines)
    if "Version number is invalid" in text or "Version not supported" in text:
        return _too_new(report, nsys, nsys_ver)
    if "ProtobufParseException" in text:
        # The header of 2023.1-2023.3.1 reports looks old (`Report 1.`), but their session record
        # has fields older nsys cannot parse; only the embedded version tells "too new" apart
        # from "damaged".
        captured = report_version(report)
        if captured is None or _version_key(captured) > _version_key(nsys_ver):
            return _too_new(report, nsys, nsys_ver)
        return NsysanError(
            f"nsys {nsys_ver} could not parse {report.name} (ProtobufParseException) although the "
            f"report comes from Nsight Systems {captured}; the file may be damaged, so copy it again"
        )
    if returncode < 0:
        return NsysanError(
            f"nsys ({nsys}) was killed by signal {-returncode} while exporting {report.name}; "
            f"try again, or export it yourself with `nsys export --type sqlite {report.name}`"
        )
    return NsysanError(
        f"nsys export of {report.name} failed (exit {returncode}): {_error_line(lines)}; "
        f"run `nsys export --type sqlite {report.name}` to see its full output"
    )


def _export_into(entry: Path, report: Path, nsys: Path, nsys_ver: str,
                 progress: Callable[[float], None] | None, timeout_s: float | None) -> None:
    """Export `report` with `nsys` and move the result to `entry` once it is known complete.

    nsys writes into a temporary file in the cache directory; `os.replace` puts it in place
    only after nsys exited 0 and the file holds a whole export, so a crash, a timeout or Ctrl-C
    never leaves a half-written entry that a later run would trust.
    """
    handle, tmp_name = tempfile.mkstemp(dir=entry.parent, prefix=f".{entry.stem}.", suffix=".sqlite")
    os.close(handle)
    tmp = Path(tmp_name)
    command = [
        str(nsys), "export", "--type", "sqlite", "--force-overwrite", "true", *export_arguments(nsys),
        "--output", str(tmp), str(report.absolute()),  # absolute: a name starting with '-' is no option
    ]
    output = _NsysOutput(progress)
    try:
        try:
            returncode = _run_nsys(command, output, timeout_s)
        except TimeoutError:
            raise NsysanError(
                f"nsys export of {report.name} did not finish within {timeout_s:g} s and was "
                f"stopped; raise NSYSAN_EXPORT_TIMEOUT, or export it yourself with "
                f"`nsys export --type sqlite {report.name}`"
            ) from None
        except OSError as err:
            raise NsysanError(
                f"could not run {nsys} ({err.strerror}); check --nsys / NSYSAN_NSYS"
            ) from err
        if returncode != 0:
            raise _export_failed(report, nsys, nsys_ver, returncode, output.lines)
        if not is_complete_export(tmp):
            raise NsysanError(
                f"nsys {nsys_ver} exited cleanly but wrote an incomplete export of {report.name}; "
                f"try a newer Nsight Systems with --nsys, or export it where it was captured"
            )
        os.replace(tmp, entry)
        if progress is not None and output.last_fraction != 1.0:
            progress(1.0)
    finally:
        for path in (tmp, Path(f"{tmp}-journal")):
            with contextlib.suppress(OSError):
                path.unlink()


# ---------------------------------------------------------------------------------------------
# The entry point


def ensure_sqlite(report: Path, *, nsys: str | Path | None = None, cache_dir: Path | None = None,
                  progress: Callable[[float], None] | None = None,
                  timeout_s: float | None = None, use_sibling: bool = True) -> ExportResult:
    """Return a complete SQLite export of `report`, exporting it with nsys only when needed.

    A `.sqlite` is returned as given; a matching sibling `<stem>.sqlite` is reused (unless
    `use_sibling` is False: it turned out damaged); otherwise the export comes from the cache (key: sha256 of the report + nsys version) or is made into it.
    `progress` gets fractions 0..1 while nsys runs. `timeout_s` (default $NSYSAN_EXPORT_TIMEOUT)
    bounds the nsys run. Every problem a user can cause raises NsysanError with one line.
    """
    report = Path(report)
    if _input_kind(report) == "sqlite":
        return ExportResult(report, exported_with=None, from_cache=False)
    sibling = _matching_sibling(report) if use_sibling else None
    if sibling is not None:
        return ExportResult(sibling, exported_with=None, from_cache=False, from_sibling=True)

    nsys_path = find_nsys(nsys, report=report)
    version = nsys_version(nsys_path)
    timeout = _export_timeout(timeout_s)
    try:
        key = f"{_content_digest(report)}-nsys{re.sub(r'[^0-9A-Za-z.]', '_', version)}"
        # Exports with NVTX payloads are other files than the ones made before nsysan asked for them.
        key += "-blobs" if export_arguments(nsys_path) else ""
    except OSError as err:
        raise NsysanError(f"can't read {report} ({err.strerror}); check the file") from err
    cache = resolve_cache_dir(cache_dir)
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise NsysanError(
            f"can't use the export cache at {cache} ({err.strerror}); "
            f"set NSYSAN_CACHE_DIR to a writable directory"
        ) from err
    entry = cache / f"{key}.sqlite"
    if is_complete_export(entry):
        return ExportResult(entry, exported_with=version, from_cache=True)

    try:
        with _exclusive_lock(cache / f"{key}.lock"):
            # Another run may have finished this very export while we waited for the lock.
            if is_complete_export(entry):
                return ExportResult(entry, exported_with=version, from_cache=True)
            _remove_leftovers(cache, key)
            _export_into(entry, report, nsys_path, version, progress, timeout)
    except OSError as err:
        raise NsysanError(
            f"can't write the export cache at {cache} ({err.strerror}); "
            f"set NSYSAN_CACHE_DIR to a writable directory"
        ) from err
    return ExportResult(entry, exported_with=version, from_cache=False)
