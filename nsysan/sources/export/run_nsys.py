"""Running `nsys export` into the cache: a time limit, progress from its output, its process group
killed on Ctrl-C or a timeout, and its failures turned into one line."""

from __future__ import annotations

import contextlib
import math
import os
import queue
import re
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from ...errors import NsysanError
from ..sqlite_file import ALWAYS_EXPORTED, connect_readonly, same_strings, table_names, tables_missing
from .input_files import is_complete_export
from .nsys import _major_minor, _version_key, export_arguments, exports_tables, report_version

_KEPT_OUTPUT_LINES = 40

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

    def started(self) -> None:
        """nsys runs: progress 0 (the command line imports the analyses from then on, issue 31)."""
        if self._progress is not None:
            self._progress(0.0)
        self.last_fraction = 0.0

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
        output.started()
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


def _one_line(text: str) -> str:
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return text if len(text) <= 300 else text[:297] + "..."


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
                 progress: Callable[[float], None] | None, timeout_s: float | None,
                 tables: Sequence[str] | None = None) -> tuple[str, ...] | None:
    """Export `report` with `nsys` and move the result to `entry` once it is known complete;
    `tables`: only those (`--tables`, where this nsys has it). Returns the tables exported (None:
    every table).

    nsys writes into a temporary file in the cache directory; `os.replace` puts it in place
    only after nsys exited 0 and the file holds a whole export, so a crash, a timeout or Ctrl-C
    never leaves a half-written entry that a later run would trust. An export with `--tables`
    that fails, or that lacks what every such export holds (ALWAYS_EXPORTED: nsys did not take
    the list as meant), is made again with every table: slower, never short of a table.
    """
    handle, tmp_name = tempfile.mkstemp(dir=entry.parent, prefix=f".{entry.stem}.", suffix=".sqlite")
    os.close(handle)
    tmp = Path(tmp_name)
    asked = tuple(tables) if tables and exports_tables(nsys) else None
    try:
        returncode, output = _run_export(tmp, report, nsys, progress, timeout_s, asked)
        if asked is not None and (returncode != 0 or not _holds(tmp, ALWAYS_EXPORTED)):
            asked = None
            returncode, output = _run_export(tmp, report, nsys, progress, timeout_s, None)
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
        return asked
    finally:
        for path in (tmp, Path(f"{tmp}-journal")):
            with contextlib.suppress(OSError):
                path.unlink()


def _add_tables(entry: Path, held: Sequence[str], wanted: Sequence[str], report: Path, nsys: Path, nsys_ver: str,
                progress: Callable[[float], None] | None, timeout_s: float | None) -> tuple[str, ...] | None:
    """Give the cached export `entry`, made with `--tables` `held`, the tables of `wanted` it lacks:
    nsys exports only those (with ALWAYS_EXPORTED, to tell that it took the list), and they are
    appended into a copy of the entry that then replaces it, so a reader of the entry meanwhile
    reads the old one whole. The tables held are not exported again: on the GPT-2 capture the
    kernel table alone took 0.81-1.17 s, and exporting nsysan's first list with it again costs the
    API table once more, about 0.3 s (issue 31). Returns the tables the entry now holds (None:
    every table, where nsys did not take the list and exported everything)."""
    adding = tuple(dict.fromkeys([*(t for t in wanted if tables_missing(held, [t])), *ALWAYS_EXPORTED]))
    part = part_path(entry)
    try:
        if _export_into(part, report, nsys, nsys_ver, progress, timeout_s, adding) is None:
            os.replace(part, entry)
            return None
        if _append_tables(entry, part):
            return tuple(wanted)
    finally:
        with contextlib.suppress(OSError):
            part.unlink()
    # The part could not be appended: its strings differ from the entry's (nsys 2025.3.1 writes every
    # string of the report whatever the tables, so not there), or one of the two can't be read. Its
    # names would be read against the wrong strings: everything wanted is exported anew.
    return _export_into(entry, report, nsys, nsys_ver, progress, timeout_s, tuple(wanted))


def part_path(entry: Path) -> Path:
    """Where the tables added to `entry` are exported first (its temporary files are `.<key>.*`)."""
    return entry.with_name(f"{entry.stem}.part.sqlite")


def _append_tables(entry: Path, part: Path) -> bool:
    """Replace the export `entry` by a copy of it holding also the tables of the export `part` that
    it lacks, row for row and in their order (their indexes too). False, leaving `entry` as it
    was, when the two exports' strings (StringIds, which the tables name by id) differ or either
    export can't be read."""
    handle, name = tempfile.mkstemp(dir=entry.parent, prefix=f".{entry.stem}.", suffix=".sqlite")
    os.close(handle)
    merged = Path(name)
    try:
        shutil.copyfile(entry, merged)
        with contextlib.closing(sqlite3.connect(merged, isolation_level=None)) as conn:
            conn.execute("PRAGMA journal_mode=OFF")  # a copy, thrown away on any failure
            conn.execute("ATTACH DATABASE ? AS part", (str(part),))
            if not same_strings(conn, "part"):
                return False
            held = table_names(conn)
            objects = conn.execute("SELECT type, tbl_name, sql FROM part.sqlite_master WHERE sql IS NOT NULL "
                                   "ORDER BY type = 'index'").fetchall()  # tables before their indexes
            new = {table for kind, table, _ in objects if kind == "table" and table not in held}
            conn.execute("BEGIN")
            for _, table, sql in objects:
                if table in new:
                    conn.execute(sql)
            for table in new:
                conn.execute(f'INSERT INTO main."{table}" SELECT * FROM part."{table}"')
            conn.execute("COMMIT")
        os.replace(merged, entry)
        return True
    except sqlite3.DatabaseError:
        return False
    finally:
        with contextlib.suppress(OSError):
            merged.unlink()


def _run_export(tmp: Path, report: Path, nsys: Path, progress: Callable[[float], None] | None,
                timeout_s: float | None, tables: tuple[str, ...] | None) -> tuple[int, _NsysOutput]:
    """One `nsys export` of `report` into `tmp`: its exit code and its output."""
    command = [
        str(nsys), "export", "--type", "sqlite", "--force-overwrite", "true", *export_arguments(nsys, tables),
        "--output", str(tmp), str(report.absolute()),  # absolute: a name starting with '-' is no option
    ]
    output = _NsysOutput(progress)
    try:
        return _run_nsys(command, output, timeout_s), output
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


def _holds(path: Path, tables: Sequence[str]) -> bool:
    """Whether the SQLite file at `path` has every one of `tables`."""
    try:
        with contextlib.closing(connect_readonly(path)) as conn:
            return set(tables) <= table_names(conn)
    except sqlite3.DatabaseError:
        return False
