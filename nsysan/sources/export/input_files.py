"""The input files themselves: what kind a path is (report, SQLite export, or something to refuse
with one line), opening without blocking on FIFOs and devices, and whether a SQLite file is a
whole nsys export."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import sqlite3
import stat
from pathlib import Path
from typing import BinaryIO

from ...errors import NsysanError
from ..sqlite_file import COMPLETE_EXPORT_TABLES, connect_readonly, table_names

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
REPORT_MAGIC = b"NVIDIA Tegra Profiler Report"
SQLITE_MAGIC = b"SQLite format 3\x00"

# What SQLite keeps beside a database: the write-ahead log, its index, the rollback journal.
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


# ---------------------------------------------------------------------------------------------
# Opening files without blocking on special ones

_FILE_TYPES = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def describe_file_type(mode: int) -> str:
    """"a FIFO (named pipe)", "a character device", ... for a file that is not a regular one."""
    return next((name for test, name in _FILE_TYPES if test(mode)), "not a regular file")


# Flags of an open that never waits (O_NONBLOCK), never becomes the controlling terminal, and
# reads bytes as they are (O_BINARY: Windows). The ones a platform lacks are left out.
NO_WAITING = (getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
               | getattr(os, "O_BINARY", 0))


def open_regular(path: Path) -> BinaryIO:
    """Open `path` for reading when it is a regular file; OSError(EINVAL) saying what it is if not.

    O_NONBLOCK: opening a FIFO for reading would wait forever for a writer, and reading a
    terminal or a socket for a reader that never comes; the type is checked on the open file.
    """
    fd = os.open(path, os.O_RDONLY | NO_WAITING)
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


# 16 MiB at a time: the read and sha256 let go of the GIL for each chunk, and while the analyses
# are imported beside the export (commands/analyze.py) taking it back can wait a switch interval
# (5 ms): an 11 MB report read in 1 MiB chunks waited up to 0.1 s more before its export (issue 31).
_HASH_CHUNK = 1 << 24


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, read in chunks so large reports stay out of memory; OSError for
    anything but a regular file (opening a FIFO to read would wait for a writer forever)."""
    digest = hashlib.sha256()
    with open_regular(path) as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_regular(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a small input (an analysis or baseline JSON, an nvidia-smi log, a config
    file), opened as the reports are: a regular file only (a FIFO never waits for a writer,
    /dev/zero is refused before it fills the memory), at most `limit` bytes. `what` names the
    input in the one line of an NsysanError ("--smi gpu.csv", "base.analysis.json")."""
    try:
        with open_regular(Path(path)) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                raise NsysanError(f"{what} is {size:,} bytes, more than the {limit:,} such a file can be; "
                                  "check that it is the file meant")
            data = handle.read(limit + 1)  # a file growing while read stops here too
    except FileNotFoundError:
        raise NsysanError(f"{what}: no such file; check the path") from None
    except IsADirectoryError:
        raise NsysanError(f"{what} is a directory, not a file") from None
    except OSError as err:
        if err.errno == errno.EINVAL and err.strerror and err.strerror.startswith("it is "):
            raise NsysanError(f"{what} is {err.strerror[6:]}; pass the file itself, not a pipe or a device") \
                from None
        raise NsysanError(f"{what} could not be read ({err.strerror or err})") from None
    if len(data) > limit:
        raise NsysanError(f"{what} grew past {limit:,} bytes while it was read; check that it is the file meant")
    return data


# ---------------------------------------------------------------------------------------------
# Checking SQLite files


def is_complete_export(path: Path) -> bool:
    """Return True when `path` is a SQLite file holding a whole nsys export, not a leftover.

    True needs at least one of sqlite_file.COMPLETE_EXPORT_TABLES; a file with only StringIds and
    ProcessStreams is what a failed nsys export leaves behind, and a file shorter than its
    header says is what a full disk or an interrupted copy leaves behind.
    """
    path = Path(path)
    if not path.is_file() or sqlite_truncation(path) is not None:
        return False
    try:
        with contextlib.closing(connect_readonly(path)) as conn:
            return not table_names(conn).isdisjoint(COMPLETE_EXPORT_TABLES)
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

