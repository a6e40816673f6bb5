"""Whether the `<stem>.sqlite` beside a report is provably that report's export, so it can be read
in its place."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import sqlite3
import stat
from pathlib import Path

from ..sqlite_file import connect_readonly, export_identity
from ..snapshot import live_writer, pending_state
from .input_files import describe_file_type, is_complete_export
from .nsys import _is_version, _report_ends, _version_key, report_version


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
    head, tail = _report_ends(report)
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
    try:
        with contextlib.closing(connect_readonly(sibling)) as conn:
            identity = export_identity(conn)
    except sqlite3.DatabaseError:
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

