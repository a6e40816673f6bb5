"""The nsys export as an SQLite file: opening it read-only, which tables nsysan exports and reads,
and what the export records about itself (its input, its exporter, its `--tables`).

What the export holds about the capture (versions, flags, GPUs, processes) is probed in schema.py;
this module needs neither the model nor the probe, so the export (sources/export/) imports only it
before nsys starts.
"""

from __future__ import annotations

import fnmatch
import os
import re
import sqlite3
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence


# A complete export has at least one of these. nsys 2022.4 fails on 2023.1-2023.3.1 reports
# (ProtobufParseException, exit 1) yet leaves a file holding only StringIds and ProcessStreams:
# checking that the output exists is not enough.
COMPLETE_EXPORT_TABLES = frozenset({
    "TARGET_INFO_SESSION_START_TIME", "ANALYSIS_DETAILS", "EXPORT_META_DATA",
    "META_DATA_EXPORT", "CUPTI_ACTIVITY_KIND_RUNTIME",
})
# Up to 2023.2 the export metadata is EXPORT_META_DATA/EXPORT_INPUT_FILE, from 2023.3 on it is
# META_DATA_EXPORT/EXPORT_PARAM_INPUT_FILE; both are (name, value) tables.
EXPORT_META_TABLES = ("EXPORT_META_DATA", "META_DATA_EXPORT")
EXPORT_INPUT_KEYS = ("EXPORT_INPUT_FILE", "EXPORT_PARAM_INPUT_FILE")

# Every table nsysan reads, by its exact name: what nsysan exports where nsys has `--tables`
# (2023.4 on): on a 150-step GPT-2 training capture (nsys 2025.3.1, docs/export_timings_v25.json)
# 0.60-0.65 s and 11.3 MB against 1.62-1.84 s and 30.8 MB for every table. Names only: nsys
# 2025.3.1 matched no table with the glob patterns `TARGET_INFO_*`, `META_DATA_*`, `ENUM_*`, and
# exports none of those it is not given (not even META_DATA_EXPORT); a name the report lacks is
# no error. A table read anywhere must be named here (tests/test_export_tables.py checks that),
# since a cached export holds these and no others. Presence counts too, not only rows: an empty
# NVTX_EVENTS or CUPTI_ACTIVITY_KIND_RUNTIME says what was traced (Schema.has_nvtx_table).
EXPORTED_TABLES = (
    "StringIds", "ThreadNames", "PROCESSES", "ANALYSIS_DETAILS", "DIAGNOSTIC_EVENT",
    "META_DATA_EXPORT", "META_DATA_CAPTURE", "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV",
    "TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE", "ENUM_CUDA_MEM_KIND", "ENUM_CUDA_DEV_MEM_EVENT_OPER",
    "CUDA_GPU_MEMORY_USAGE_EVENTS", "CUDA_GPU_MEMORY_POOL_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUDA_CALLCHAINS", "NVTX_EVENTS", "NVTX_PAYLOAD_SCHEMAS", "NVTX_PAYLOAD_SCHEMA_ENTRIES",
    "CUPTI_ACTIVITY_KIND_KERNEL",  # the launch sequence of steps without NVTX (events/read_launches.py)
    "TARGET_INFO_CUDA_CONTEXT_INFO",  # which GPUs each process holds a context on (events/read_code.py)
)
# Exported only when a process's steps must be found from its launches (no NVTX range gives them,
# analyses/iterations.py): the kernel table names each launch's kernel, and on the GPT-2 capture
# it is 121k of 630k rows, the most of what `--tables` exports (x1.31 faster than every table with
# it, x2.8 without). nsysan exports FIRST_EXPORT_TABLES, then adds these to the cached export
# (pipeline/stages.py) when the first export's NVTX and API tables leave a process without steps.
LAUNCH_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL",)
FIRST_EXPORT_TABLES = tuple(t for t in EXPORTED_TABLES if t not in LAUNCH_TABLES)
# What an export asked for them holds whatever the capture was (every report has strings and
# export metadata, 2023.4 on): without them, nsys did not take the list as meant.
ALWAYS_EXPORTED = ("StringIds", "META_DATA_EXPORT")


def tables_requested(export_params: dict[str, str]) -> Optional[tuple[str, ...]]:
    """The `--tables` an export was made with (as its META_DATA_EXPORT records them), or None
    for an export of every table."""
    listed = export_params.get("EXPORT_PARAM_TABLES_TO_EXPORT", "")
    names = tuple(name for name in re.split(r"[,;\s]+", listed) if name)
    return names or None


def tables_missing(requested: Optional[Sequence[str]], needed: Sequence[str] = EXPORTED_TABLES) -> list[str]:
    """The `needed` tables that an export of `requested` (None: every table) may lack: those no
    requested name covers, nor a pattern, read as a glob or as a regular expression (which of the
    two nsys means is not documented; either one covering a table counts), in any case."""
    if requested is None:
        return []
    return [n for n in needed if not any(_pattern_covers(r, n) for r in requested)]


def _pattern_covers(pattern: str, table: str) -> bool:
    if fnmatch.fnmatchcase(table.upper(), pattern.upper()):
        return True
    try:
        return re.fullmatch(pattern, table, re.IGNORECASE) is not None
    except re.error:
        return False

def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open an SQLite file so that nothing can be written to it or next to it.

    The path is percent-encoded because it becomes a URI ('?', '#' and '%' in names work).
    immutable=1: no locks, no journal, no -wal/-shm files beside a file that may sit in a
    read-only folder. Text is decoded leniently: some exports hold binary protobuf blobs in TEXT
    columns (TARGET_INFO_SYSTEM_ENV.GpuInfo in 2022.4).
    """
    # os.fsencode: a name with bytes that are not UTF-8 (a surrogate in Python) keeps its bytes.
    uri = f"file:{urllib.parse.quote(os.fsencode(Path(path).absolute()))}?mode=ro&immutable=1"
    conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    return conn


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def same_strings(conn: sqlite3.Connection, attached: str) -> bool:
    """Whether the export attached to `conn` as `attached` holds the same strings (StringIds, which
    the tables name by id) as the main one: only then can a table of one be read with the other's."""
    return bool(conn.execute(
        f"SELECT (SELECT count(*) FROM {attached}.StringIds) = (SELECT count(*) FROM main.StringIds) AND NOT EXISTS "
        f"(SELECT id, value FROM {attached}.StringIds EXCEPT SELECT id, value FROM main.StringIds)").fetchone()[0])


def export_parameters(conn: sqlite3.Connection) -> dict[str, str]:
    """The (name, value) rows of the export's metadata table (EXPORT_META_DATA or META_DATA_EXPORT)."""
    tables = table_names(conn)
    found: dict[str, str] = {}
    for table in EXPORT_META_TABLES:
        if table in tables:
            found.update((cell_text(k), cell_text(v)) for k, v in conn.execute(f"SELECT name, value FROM {table}"))
    return found


@dataclass(frozen=True)
class ExportIdentity:
    """What an export records about the report it was made from."""

    input_name: Optional[str]        # EXPORT_INPUT_FILE / EXPORT_PARAM_INPUT_FILE
    exporter_version: Optional[str]  # EXPORT_PRODUCT_VERSION: the nsys that exported it
    session_starts: tuple[str, ...]  # TARGET_INFO_SESSION_START_TIME utcTime and localTime, as text


def export_identity(conn: sqlite3.Connection) -> ExportIdentity:
    """The input name, exporter version and capture start an export records (each may be missing)."""
    meta = export_parameters(conn)
    starts: list[str] = []
    if "TARGET_INFO_SESSION_START_TIME" in table_names(conn):
        for row in conn.execute("SELECT utcTime, localTime FROM TARGET_INFO_SESSION_START_TIME LIMIT 1"):
            starts += [str(value) for value in row if value is not None]
    return ExportIdentity(next((meta[k] for k in EXPORT_INPUT_KEYS if k in meta), None),
                          meta.get("EXPORT_PRODUCT_VERSION"), tuple(starts))


def cell_text(value: object) -> str:
    """A cell as text: "" for NULL, bytes decoded leniently (some exports hold blobs in TEXT columns)."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)

