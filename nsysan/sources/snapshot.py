"""Read the committed state of an SQLite file, whatever SQLite left beside it.

nsysan opens exports with `immutable=1` (no locks, no files written beside them, fast), and
that reads the main file alone. Three states make the main file alone wrong:

- a write-ahead log (`-wal`) with frames: committed transactions live there, not yet in the
  main file (reading the main file alone gives a stale answer);
- a hot rollback journal (`-journal`) left by a writer that crashed: the main file holds torn,
  uncommitted pages, and the journal the pages to put back;
- a live writer holding its lock: its pages are being written right now.

The first two are read from a private snapshot: the main file and its log or journal are copied
into nsysan's own scratch folder, where SQLite itself replays the log or rolls the journal back,
so exactly the committed state is analyzed and nothing the user owns is touched. The third is
refused in one line, as is a file that changes while it is copied or read.

    with committed_state(path, scratch) as readable:   # `readable` opens with immutable=1
        ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

from ..errors import NsysanError

JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
WAL_HEADER_BYTES = 32
# SQLite's lock bytes in the main file (os_unix.c): PENDING, RESERVED, then 510 SHARED bytes.
# A writer holds a write lock on RESERVED (it is writing a transaction) or on PENDING/SHARED
# (it is about to write, or writing, pages into the main file).
PENDING_BYTE = 0x40000000
LOCK_SPAN = 2 + 510
# In WAL mode, locks live in the -shm file: byte 120 is the writer's, 121 the checkpointer's.
WAL_WRITE_LOCK = 120


def pending_state(path: Path) -> Optional[str]:
    """"wal" when a write-ahead log with frames is beside `path`, "journal" for a hot rollback
    journal, None when the main file alone is the committed state."""
    wal = Path(f"{path}-wal")
    with contextlib.suppress(OSError):
        if wal.stat().st_size > WAL_HEADER_BYTES:
            return "wal"
    journal = Path(f"{path}-journal")
    with contextlib.suppress(OSError):
        # An empty journal, or one whose header was zeroed, is what a committed transaction
        # leaves (journal_mode TRUNCATE, PERSIST): nothing to roll back.
        if journal.stat().st_size > 0 and _first_bytes(journal, len(JOURNAL_MAGIC)) == JOURNAL_MAGIC:
            return "journal"
    return None


def live_writer(path: Path) -> Optional[int]:
    """The pid of a process holding a write lock on the SQLite file at `path` (or on its WAL
    index), or None. Only asks (F_GETLK): takes no lock, writes nothing."""
    if not sys.platform.startswith("linux"):
        return None  # struct flock differs elsewhere; the before/after comparison still holds
    try:
        import fcntl
    except ImportError:  # a Python without it: the before/after comparison still holds
        return None

    for file, start, length in ((path, PENDING_BYTE, LOCK_SPAN), (Path(f"{path}-shm"), WAL_WRITE_LOCK, 2)):
        try:
            fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # Linux only, see above
        except OSError:
            continue
        try:
            query = struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, start, length, 0)
            lock_type, _, _, _, pid = struct.unpack("hhqqi4x", fcntl.fcntl(fd, fcntl.F_GETLK, query))
        except OSError:
            continue
        finally:
            os.close(fd)
        if lock_type != fcntl.F_UNLCK:
            return pid
    return None


@contextlib.contextmanager
def committed_state(path: Path, scratch: Path) -> Iterator[Path]:
    """A path whose main file alone holds the committed state of the SQLite file at `path`:
    `path` itself when nothing is pending beside it, else a private snapshot in a new folder
    under `scratch`, removed on exit. Raises NsysanError for a live writer, or when the file
    changes while it is copied or read."""
    path = Path(path)
    _refuse_live_writer(path)
    state = pending_state(path)
    if state is None:
        before = _identity(path)
        yield path
        if _identity(path) != before:
            raise _changed(path)
        return
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=".snapshot-", dir=scratch))
    except OSError as err:
        raise NsysanError(f"{path.name} has a {_what(state)} beside it, and reading its committed state needs a "
                          f"private copy, but {scratch} can't be written ({err.strerror}); set NSYSAN_CACHE_DIR "
                          "to a writable directory") from err
    try:
        copy = folder / "export.sqlite"
        before = _identity(path)
        try:
            shutil.copyfile(path, copy)
            for tail in ("-wal", "-journal"):
                if Path(f"{path}{tail}").exists():
                    shutil.copyfile(f"{path}{tail}", f"{copy}{tail}")
        except OSError as err:
            raise NsysanError(f"could not copy {path.name} with its {_what(state)} to read its committed state "
                              f"({err.strerror}); free some space in {scratch}, or set NSYSAN_CACHE_DIR") from err
        if _identity(path) != before:
            raise _changed(path)
        _refuse_live_writer(path)
        _settle(copy, path.name, state)
        yield copy
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _settle(copy: Path, name: str, state: str) -> None:
    """Let SQLite replay the log or roll the journal back in the private copy, and leave a main
    file that holds everything committed (no log beside it)."""
    try:
        with contextlib.closing(sqlite3.connect(copy, isolation_level=None)) as conn:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # recovery happens here
            if state == "wal":
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                conn.execute("PRAGMA journal_mode=DELETE").fetchone()
    except sqlite3.DatabaseError as err:
        raise NsysanError(f"{name} could not be read with its {_what(state)} ({err}); it may be damaged, so "
                          "copy or export it again") from err


def _refuse_live_writer(path: Path) -> None:
    pid = live_writer(path)
    if pid is not None:
        raise NsysanError(f"{path.name} is being written by another process (pid {pid} holds its write lock), "
                          "so what it holds now may be half a transaction; analyze it once that process has "
                          "finished")


def _identity(path: Path) -> tuple:
    """What changes when anything writes the file or the log and journal beside it."""
    found = []
    for file in (path, Path(f"{path}-wal"), Path(f"{path}-journal")):
        try:
            st = os.stat(file)
            found.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        except OSError:
            found.append(None)
    return tuple(found)


def _changed(path: Path) -> NsysanError:
    return NsysanError(f"{path.name} changed while nsysan was reading it (another process is writing it); "
                       "analyze it once nothing writes it any more, or analyze a copy")


def _what(state: str) -> str:
    return "write-ahead log (-wal)" if state == "wal" else "rollback journal (-journal) left by a writer that stopped"


def _first_bytes(path: Path, count: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        return os.read(fd, count)
    finally:
        os.close(fd)
