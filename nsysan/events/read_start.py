"""What was live when the capture began: a capture that starts while the program runs
(`--capture-range=cudaProfilerApi` or `nvtx`, `--delay`) opens its memory table with one
allocation row at time 0 for every block already live (nsys's snapshot of the state; no call of
the capture made them), and what started it. With the other `events/read*.py` modules and
`schema.py`, the only code that names nsys tables and columns.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Optional

from ..base import apis
from ..sources.schema import Schema

PROFILER_START_APIS = ("cudaProfilerStart", "cuProfilerStart")
FIRST_ROWS = 1000  # the snapshot's rows come first: a table whose first rows hold none has none


@dataclass(frozen=True)
class CaptureStart:
    blocks: int  # allocation rows at the session's first instant
    bytes: int
    by_kind: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind -> (blocks, bytes)
    profiler_start: Optional[tuple[str, int]] = None  # (API, ns) of the first cudaProfilerStart, if any
    delay_ms: int = 0  # nsys profile --delay (META_DATA_CAPTURE START_DELAY_MS)
    pids: tuple[int, ...] = ()  # the processes those blocks belong to


def read_capture_start(conn: sqlite3.Connection, schema: Schema) -> Optional[CaptureStart]:
    """The blocks already live at the capture's start, or None when the memory table begins later."""
    table = "CUDA_GPU_MEMORY_USAGE_EVENTS"
    if not schema.has(table, "start", "bytes", "memKind", "memoryOperationType", "globalPid"):
        return None
    # exactly the session's first instant: a row stamped before it is a bad row (left out, with
    # its own diagnostic), not part of nsys's snapshot
    at_start = f"start = {int(schema.time_offset_ns)}"
    first = conn.execute(f"SELECT count(*) FROM (SELECT start FROM {table} ORDER BY rowid LIMIT {FIRST_ROWS}) "
                         f"WHERE {at_start}").fetchone()[0]
    if not first:
        return None
    allocs = ",".join(str(i) for i, name in schema.mem_ops.items() if name == "alloc") or "0"
    by_kind: dict[str, tuple[int, int]] = {}
    pids: set[int] = set()
    for kind, pid, count, size in conn.execute(
            f"SELECT memKind, (globalPid >> 24) & 16777215, count(*), sum(bytes) FROM {table} WHERE {at_start} "
            f"AND memoryOperationType IN ({allocs}) GROUP BY 1, 2"):
        name = schema.mem_kinds.get(kind, "unknown") if isinstance(kind, int) else "unknown"
        old = by_kind.get(name, (0, 0))
        by_kind[name] = (old[0] + int(count), old[1] + max(int(size or 0), 0))
        if isinstance(pid, int):
            pids.add(pid)
    if not by_kind:
        return None
    return CaptureStart(blocks=sum(c for c, _ in by_kind.values()), bytes=sum(b for _, b in by_kind.values()),
                        by_kind=by_kind, profiler_start=_profiler_start(conn, schema),
                        delay_ms=_delay_ms(conn, schema), pids=tuple(sorted(pids)))


def _profiler_start(conn: sqlite3.Connection, schema: Schema) -> Optional[tuple[str, int]]:
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not schema.has(table, "start", "nameId") or not schema.has("StringIds", "id", "value"):
        return None
    ids = {i: apis.base_name(str(v)) for i, v in conn.execute(
        "SELECT id, value FROM StringIds WHERE value LIKE 'cu%ProfilerStart%' AND length(value) < 64")
        if apis.base_name(str(v)) in PROFILER_START_APIS}
    if not ids:
        return None
    row = conn.execute(f"SELECT nameId, start FROM {table} WHERE nameId IN ({','.join(map(str, ids))}) "
                       "ORDER BY start LIMIT 1").fetchone()
    return (ids[row[0]], int(row[1]) - schema.time_offset_ns) if row and isinstance(row[1], int) else None


def _delay_ms(conn: sqlite3.Connection, schema: Schema) -> int:
    if not schema.has("META_DATA_CAPTURE", "name", "value"):
        return 0
    row = conn.execute("SELECT value FROM META_DATA_CAPTURE WHERE name = 'START_DELAY_MS'").fetchone()
    try:
        return max(int(str(row[0])), 0) if row else 0
    except ValueError:
        return 0
