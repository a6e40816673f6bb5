"""Every SQL query nsysan runs on an export's event tables, and the frames they return.

The memory table (`CUDA_GPU_MEMORY_USAGE_EVENTS`, present with `--cuda-memory-usage=true`) has
sizes, addresses and kinds but only the process; the API table (`CUPTI_ACTIVITY_KIND_RUNTIME`)
has the thread, the API name and the call stack (`CUDA_CALLCHAINS`); NVTX ranges are in
`NVTX_EVENTS` (read_nvtx.py). With `schema.py`, `read_pools.py` (the memory pools' rows and
events), `read_nvtx.py` (the NVTX ranges), `read_launches.py` (the kernel launch sequences) and
`read_start.py` (what was live when the capture began), this is the only module that names nsys
tables and columns.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Optional, TypeVar

import numpy as np
import pandas as pd

from ..base import apis
from ..sources.reader import chunk_grid, database_path, read_chunks, read_converted, read_frame, read_rowid_ranges, \
    reads_in_chunks, rowid_span
from ..sources.schema import Schema, _quote, connect_readonly
from .columns import categorical_lookup, empty_calls, empty_chains, int_column, ints




def _col(schema: Schema, table: str, column: str, default: str = "NULL") -> str:
    return _quote(column) if schema.has(table, column) else default


def read_thread_names(conn: sqlite3.Connection, schema: Schema) -> dict[tuple[int, int], str]:
    if not (schema.has("ThreadNames", "nameId", "globalTid") and schema.has("StringIds", "id", "value")):
        return {}
    sql = ("SELECT t.globalTid, CAST(substr(s.value, 1, 100) AS TEXT) FROM ThreadNames AS t "
           "JOIN StringIds AS s ON s.id = t.nameId")
    names = {}
    for global_tid, name in conn.execute(sql):
        if isinstance(global_tid, int):
            names[((global_tid >> 24) & 0xFFFFFF, global_tid & 0xFFFFFF)] = str(name)
    return names


def _memory_api_ids(conn: sqlite3.Connection, schema: Schema) -> dict[int, str]:
    """StringIds ids of memory API names -> suffix-stripped name."""
    if not schema.has("StringIds", "id", "value"):
        return {}
    # StringIds also holds every NVTX text and symbol; only short names starting with "cu" can
    # be API names, which keeps this scan cheap on large exports.
    rows = conn.execute("SELECT id, value FROM StringIds WHERE value LIKE 'cu%' AND length(value) < 64")
    ids = {}
    for string_id, value in rows:
        name = apis.base_name(str(value))
        if name in apis.FAMILIES and isinstance(string_id, int):  # a NULL/text/blob id names nothing
            ids[string_id] = name
    return ids


def read_calls(conn: sqlite3.Connection, schema: Schema) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Memory API calls, and the call stack id of each (pid, correlationId) that has one (with the
    thread and the span of the rows that carry it)."""
    calls, chains, _ = read_calls_and_rows(conn, schema, ())
    return calls, chains


# The raw columns of the other rows read_calls_and_rows returns (read_code.CODE_ROW_COLUMNS).
OTHER_ROW_COLUMNS = ["start", "end", "global_tid", "name_id"]


def split_other_rows(raw: pd.DataFrame, memory_ids: np.ndarray, other_ids: np.ndarray) \
        -> tuple[dict[str, np.ndarray], Optional[np.ndarray]]:
    """Of a chunk of API table rows read for the memory calls' names and `other_ids`: the raw rows
    (OTHER_ROW_COLUMNS) of `other_ids`, and the mask of the memory calls' rows (None: every row).
    The one split of both paths' single scan (read_calls_and_rows; stream_calls.MemoryCalls.scan)."""
    name_id = int_column(raw, "name_id", fill=-1)  # what `nameId IN (...)` compares
    other = np.isin(name_id, other_ids)
    memory = np.isin(name_id, memory_ids)
    return {c: raw[c].to_numpy()[other] for c in OTHER_ROW_COLUMNS}, None if memory.all() else memory


def read_calls_and_rows(conn: sqlite3.Connection, schema: Schema, other_ids: Collection[int]) \
        -> tuple[pd.DataFrame, pd.DataFrame, Optional[pd.DataFrame]]:
    """read_calls, and in the same scan of the API table the raw rows (OTHER_ROW_COLUMNS, rowid
    order) of the names `other_ids` (events/read_code.py's code-load and graph calls): one scan
    of the table instead of two (35 ms each on the GPT-2 capture's 258k rows). The rows are None
    when no memory call name is there to scan for (the caller reads them itself)."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    no_chains = empty_chains()
    if not schema.has(table, "start", "nameId", "globalTid", "correlationId"):
        return empty_calls(), no_chains, None
    name_ids = _memory_api_ids(conn, schema)
    if not name_ids:
        return empty_calls(), no_chains, None
    memory_list, other_list = np.array(sorted(name_ids), "int64"), np.array(sorted(other_ids), "int64")
    id_list = ",".join(str(i) for i in sorted({*name_ids, *other_list.tolist()}))
    # Backtrace twin rows (eventClass 67) and call stacks exist only with CUDA_CALLCHAINS; without
    # it, those two columns are not read at all (the largest read of a big export).
    stacks = schema.has_backtraces
    columns = ["start", "end", "global_tid", "correlation_id", "name_id", "return_value"]
    select = (f"start, {_col(schema, table, 'end', 'start')}, globalTid, correlationId, nameId, "
              f"{_col(schema, table, 'returnValue', '0')}")
    if stacks:
        columns += ["event_class", "callchain_id"]
        select += f", {_col(schema, table, 'eventClass', '0')}, {_col(schema, table, 'callchainId')}"
    # Each chunk of rows is turned into the calls' own columns as it is read (39 bytes a call
    # instead of 8 per raw value, and no copy of the raw columns when they are joined).
    def convert(raw: pd.DataFrame) -> dict[str, np.ndarray]:
        if not len(other_list):
            return _call_columns(raw, schema, stacks)
        found, memory = split_other_rows(raw, memory_list, other_list)  # a mask: no copy of the chunk's raw columns
        return {**{f"other_{c}": v for c, v in found.items()}, **_call_columns(raw, schema, stacks, memory)}

    read = read_converted(conn, table, select, columns, convert, where=f"nameId IN ({id_list})")
    others = pd.DataFrame({c: read.pop(f"other_{c}") for c in OTHER_ROW_COLUMNS}) if len(other_list) else None
    chains = no_chains
    if stacks:
        chains = pd.DataFrame({name: read.pop(f"chain_{name}") for name in no_chains.columns}, copy=False)
        # One stack per call: with --cudabacktrace, 2025.x writes a twin row (eventClass 67) that
        # carries it; older exports put it on the call's own row. The twin starts a little
        # before the call it copies: a Python stack's mark lies inside the twin, not the call.
        chains = chains.groupby(["pid", "correlation_id"], as_index=False).agg(
            callchain_id=("callchain_id", "max"), tid=("tid", "first"), ts_ns=("ts_ns", "min"), end_ns=("end_ns", "max"))
    api = categorical_lookup(read.pop("name_id"), name_ids)
    family = categorical_lookup(api.codes, dict(enumerate(apis.FAMILIES.get(a, "other") for a in api.categories)))
    calls = pd.DataFrame({
        "ts_ns": read.pop("ts_ns"), "end_ns": read.pop("end_ns"), "pid": read.pop("pid"), "tid": read.pop("tid"),
        "api": api, "family": family, "return_value": read.pop("return_value"),
        "correlation_id": read.pop("correlation_id"), "has_event": np.zeros(len(api), bool),
    }, copy=False)  # pandas copies a dict's arrays by default: 0.7 s at 1e7 calls
    return calls, chains, others


def memory_call_chunks(conn: sqlite3.Connection, schema: Schema, name_ids: list[int], chunk_rowids: int,
                       rowids: Optional[tuple[int, int]] = None) -> Iterator[tuple[Optional[tuple[int, int]], pd.DataFrame]]:
    """The raw rows of the memory API calls (names `name_ids`: _memory_api_ids) with their rowid
    (`position`), as read_calls reads them, `chunk_rowids` rowids at a time in rowid order (of the
    rows between two rowids): (its rowids, its rows) per chunk, or (None, every row) when the
    table can't be read by rowid ranges."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not name_ids or not schema.has(table, "start", "nameId", "globalTid", "correlationId"):
        return
    select, columns, where = _memory_call_query(schema, name_ids)
    span = rowid_span(conn, table) if reads_in_chunks(conn, table) else None
    if span is None:
        yield None, read_frame(conn, f"SELECT {select} FROM {table} WHERE {where}", columns)
        return
    low = rowids[0] if rowids else conn.execute(f"SELECT min(rowid) FROM {table}").fetchone()[0]
    high = rowids[1] if rowids else low + span - 1
    grid = chunk_grid(conn, table, low, high, chunk_rowids)  # read_chunks reads the same ranges
    # two chunks read at a time: the scan of the API calls (stream_calls.MemoryCalls) waits on SQLite
    yield from zip(grid, read_chunks(conn, table, select, columns, chunk_rowids, (low, high), where, ahead=2))


def memory_call_ranges(conn: sqlite3.Connection, schema: Schema, name_ids: list[int],
                       ranges: list[tuple[int, int]]) -> Iterator[pd.DataFrame]:
    """memory_call_chunks' rows of each of the rowid ranges of its chunks, in the order given, the
    next one read ahead on a second thread (stream_calls.CallWindow reads the chunks by their
    earliest start)."""
    select, columns, where = _memory_call_query(schema, name_ids)
    return read_rowid_ranges(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", select, columns, ranges, where)


def _memory_call_query(schema: Schema, name_ids: list[int]) -> tuple[str, list[str], str]:
    """(select, its columns, where) of the memory API calls' rows."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    select = (f"rowid, start, {_col(schema, table, 'end', 'start')}, globalTid, correlationId, nameId, "
              f"{_col(schema, table, 'returnValue', '0')}")
    columns = ["position", "start", "end", "global_tid", "correlation_id", "name_id", "return_value"]
    if schema.has_backtraces:
        select += f", {_col(schema, table, 'eventClass', '0')}, {_col(schema, table, 'callchainId')}"
        columns += ["event_class", "callchain_id"]
    return select, columns, f"nameId IN ({','.join(str(i) for i in sorted(name_ids))})"


def memory_call_names(conn: sqlite3.Connection, schema: Schema) -> dict[int, str]:
    """StringIds ids of the memory API names -> suffix-stripped name ({} without an API table)."""
    if not schema.has("CUPTI_ACTIVITY_KIND_RUNTIME", "start", "nameId", "globalTid", "correlationId"):
        return {}
    return _memory_api_ids(conn, schema)


def _call_columns(raw: pd.DataFrame, schema: Schema, stacks: bool,
                  keep: Optional[np.ndarray] = None) -> dict[str, np.ndarray]:
    """One chunk of raw API rows as the calls' columns (and, with `stacks`, the rows carrying a
    call stack as `chain_*` columns); `keep`: only these rows (a mask), when the chunk holds others."""
    global_tid = int_column(raw, "global_tid")
    pid = ((global_tid >> 24) & 0xFFFFFF).astype("int32")
    correlation = int_column(raw, "correlation_id")
    start, end = int_column(raw, "start"), int_column(raw, "end")
    columns = {}
    real = slice(None) if keep is None else keep
    if stacks:
        chain = ints(raw, "callchain_id")
        has_chain = chain.notna().to_numpy() if keep is None else chain.notna().to_numpy() & keep
        columns.update(chain_pid=pid[has_chain], chain_correlation_id=correlation[has_chain],
                       chain_callchain_id=chain[has_chain].to_numpy(dtype="int64"),
                       chain_tid=(global_tid[has_chain] & 0xFFFFFF).astype("int32"),
                       chain_ts_ns=start[has_chain] - schema.time_offset_ns,
                       chain_end_ns=end[has_chain] - schema.time_offset_ns)
        real = int_column(raw, "event_class") != 67  # the twins duplicate calls: never count or time them
        real = real if keep is None else real & keep
    start, end = start[real] - schema.time_offset_ns, end[real] - schema.time_offset_ns
    columns.update(
        ts_ns=start, end_ns=np.maximum(end, start), pid=pid[real], tid=(global_tid[real] & 0xFFFFFF).astype("int32"),
        name_id=int_column(raw, "name_id")[real],
        return_value=np.clip(int_column(raw, "return_value")[real], -2**31, 2**31 - 1).astype("int32"),
        correlation_id=correlation[real])
    return columns


def read_alone(read: Callable[..., T], conn: sqlite3.Connection, schema: Schema, *more: Any) -> T:
    """`read(conn, schema, *more)` on a connection of its own (it runs on another thread)."""
    path = database_path(conn)
    if path is None:  # an in-memory database: share the connection
        return read(conn, schema, *more)
    with contextlib.closing(connect_readonly(Path(path))) as own:
        return read(own, schema, *more)



MEMORY_TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
MEMORY_COLUMNS = ["start", "global_pid", "device", "address", "bytes", "mem_kind", "op_type", "correlation_id",
                  "pool_address", "pool_size"]


def no_memory_rows() -> pd.DataFrame:
    """The memory table's columns without a row: what an export without the table holds."""
    return pd.DataFrame({c: pd.Series(dtype="int64") for c in MEMORY_COLUMNS})


def memory_rowid_span(conn: sqlite3.Connection, schema: Schema) -> int:
    """How many rowids the memory table spans (its rows, unless some were deleted); 0 when it is
    empty, absent or has no usable rowid (such a table is read whole anyway)."""
    if not schema.memory_usage_collected:
        return 0
    return rowid_span(conn, MEMORY_TABLE) or 0


def memory_row_count(conn: sqlite3.Connection, schema: Schema) -> int:
    """How many rows the memory table holds (one scan of its b-tree); 0 when it is absent."""
    if not schema.memory_usage_collected:
        return 0
    return int(conn.execute(f"SELECT count(*) FROM {MEMORY_TABLE}").fetchone()[0])


def memory_event_chunks(conn: sqlite3.Connection, schema: Schema, chunk_rowids: int,
                        rowids: Optional[tuple[int, int]] = None) -> Iterator[pd.DataFrame]:
    """The memory table's rows (MEMORY_COLUMNS, and their rowid, `position`) `chunk_rowids` rowids
    at a time, in rowid order; `rowids`: those between two rowids alone."""
    if not schema.memory_usage_collected:
        return iter([no_memory_rows()])
    return read_chunks(conn, MEMORY_TABLE, "rowid, " + _memory_select(schema), ["position"] + MEMORY_COLUMNS,
                       chunk_rowids, rowids)


def memory_sorted_runs(conn: sqlite3.Connection, chunk_rowids: int, most: int) -> Optional[list[tuple[int, int]]]:
    """The memory table as rowid ranges whose rows are in time order (`start` never decreasing),
    read a chunk of (rowid, start) at a time; None when there are more than `most` of them."""
    runs: list[tuple[int, int]] = []
    run_start, last_rowid, last_start, first_rowid = None, None, None, None
    for chunk in read_chunks(conn, MEMORY_TABLE, "rowid, start", ["rowid", "start"], chunk_rowids):
        if chunk.empty:
            continue
        rowid = int_column(chunk, "rowid")
        # The runs cover every row, those without a start too (first and last included): a row
        # left out of them would never be read, nor counted among the bad rows.
        first_rowid = int(rowid[0]) if first_rowid is None else first_rowid
        last_rowid = int(rowid[-1])
        start = ints(chunk, "start")
        known = ~start.isna().to_numpy()  # a NULL start is a bad row: it breaks no order
        rowid, start = rowid[known], start.to_numpy(dtype="int64", na_value=0)[known]
        if not len(rowid):
            continue
        if run_start is None:
            run_start = first_rowid
        previous = np.concatenate([[last_start if last_start is not None else start[0]], start[:-1]])
        for at in np.flatnonzero(start < previous).tolist():  # a new run begins
            runs.append((run_start, int(rowid[at]) - 1))
            run_start = int(rowid[at])
            if len(runs) >= most:
                return None
        last_start = int(start[-1])
    if run_start is not None:
        runs.append((run_start, last_rowid))
    return runs


def memory_chunk_first_starts(conn: sqlite3.Connection, chunk_rowids: int) -> list[Optional[int]]:
    """The earliest `start` of each chunk of memory_event_chunks (None for a chunk without one):
    what a time-ordered merge of rows written in no order must wait for."""
    table = MEMORY_TABLE
    low, high = conn.execute(f"SELECT min(rowid), max(rowid) FROM {table}").fetchone()
    if not isinstance(low, int) or not isinstance(high, int):
        return []
    # memory_event_chunks' chunks, each a range of the rowid b-tree: one scan of the table in all
    return [conn.execute(f"SELECT min(start) FROM {table} WHERE rowid BETWEEN {a} AND {b}").fetchone()[0]
            for a, b in chunk_grid(conn, table, low, high, chunk_rowids)]


def _memory_select(schema: Schema) -> str:
    table = MEMORY_TABLE
    # The pool's base and reserve (0 when not a pool allocation) come in the same scan: a second
    # scan for the few pool rows would cost as much as this one (4 s at 1e7 events).
    return (f"start, globalPid, {_col(schema, table, 'deviceId', '0')}, address, bytes, "
            f"{_col(schema, table, 'memKind', '2')}, {_col(schema, table, 'memoryOperationType', '0')}, "
            f"{_col(schema, table, 'correlationId', '0')}, "
            f"coalesce({_col(schema, table, 'localMemoryPoolAddress')}, 0), "
            f"coalesce({_col(schema, table, 'localMemoryPoolSize')}, 0)")


TAIL_ROWS = 200_000
T = TypeVar("T")


TRACE_GOES_ON = 3  # NVTX ranges starting after a process's last CUDA call that mean "incomplete"


def latest_ends(pid: np.ndarray, end: np.ndarray, into: dict[int, int]) -> dict[int, int]:
    """`into`, each process's latest call end, with the calls of `pid` and `end` (a chunk of
    them, or the whole calls frame's) merged in."""
    if len(pid) and pid.min() == pid.max():  # one process (most captures): one maximum, no grouping
        latest = int(end.max())
        into[int(pid[0])] = max(into.get(int(pid[0]), latest), latest)
        return into
    ends = pd.Series(end).groupby(pid).max()
    for p, e in zip(ends.index.tolist(), ends.tolist()):
        into[p] = max(into.get(p, e), e)
    return into


def last_cuda_calls(conn: sqlite3.Connection, schema: Schema, last_memory_calls: dict[int, int],
                    ranges: pd.DataFrame, tail: Optional[list[tuple]] = None) -> dict[int, int]:
    """When each process's CUDA trace ends (end of its last API call of any kind), given the end of
    its last memory call (`last_memory_calls`: latest_ends of the memory calls).

    A trace that stops while the process visibly goes on (NVTX ranges later) lost its end: a
    crash before nsys flushed, or an nsys too old for the driver. The full answer needs a scan
    of the whole API table, so it is computed only for processes that look suspicious from the
    memory calls and the last rows of the table (nsys writes rows in time order up to 2025.3).
    `tail`: last_calls_tail's rows, read already (events/load.py reads them beside its other work).
    """
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if ranges.empty or not schema.has(table, "globalTid", "start"):
        return {}
    last = dict(last_memory_calls)

    def merge(rows: list[tuple]) -> None:
        for pid, ts in rows:
            if isinstance(pid, int) and isinstance(ts, int):
                last[pid] = max(last.get(pid, ts - schema.time_offset_ns), ts - schema.time_offset_ns)

    known = sorted(int(p) for p in last_memory_calls)
    merge(tail if tail is not None else last_calls_tail(conn, schema, last_memory_calls, ranges) or [])
    if _ranges_after(last, ranges):
        # the whole table, only when the tail leaves a process looking cut short
        merge(_last_ends(conn, table, _end_column(schema), "", known))
    return last


def last_calls_tail(conn: sqlite3.Connection, schema: Schema, last_memory_calls: dict[int, int],
                    ranges: pd.DataFrame) -> Optional[list[tuple]]:
    """(pid, latest end) of the API table's last TAIL_ROWS rows, per process: last_cuda_calls'
    first scan (None where it reads nothing)."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if ranges.empty or not schema.has(table, "globalTid", "start"):
        return None
    return _last_ends(conn, table, _end_column(schema), f"WHERE rowid > (SELECT max(rowid) FROM {table}) - {TAIL_ROWS}",
                      sorted(int(p) for p in last_memory_calls))


def _end_column(schema: Schema) -> str:
    return '"end"' if schema.has("CUPTI_ACTIVITY_KIND_RUNTIME", "end") else "start"


def _last_ends(conn: sqlite3.Connection, table: str, end: str, where: str, pids: list[int]) -> list[tuple]:
    """(pid, latest end) of the rows `where` selects, per process. A GROUP BY sorts every row
    (0.11 s for the 200,000-row tail of a 258k-call export, against 0.03 s for one scan): the
    processes with memory calls, nearly always every process of the table, get one max() each in
    a single scan, and the GROUP BY runs only when a row of another process is there."""
    pid = "((globalTid >> 24) & 16777215)"
    if pids and len(pids) <= 64:
        listed = ",".join(str(p) for p in pids)
        maxes = ", ".join(f"max(CASE WHEN {pid} = {p} THEN {end} END)" for p in pids)
        *ends, others = conn.execute(f"SELECT {maxes}, max({pid} NOT IN ({listed})) FROM {table} {where}").fetchone()
        if not others:
            return [(p, ts) for p, ts in zip(pids, ends) if ts is not None]
    return conn.execute(f"SELECT {pid}, max({end}) FROM {table} {where} GROUP BY 1").fetchall()


def _ranges_after(last_call: dict[int, int], ranges: pd.DataFrame) -> bool:
    """Whether some process has TRACE_GOES_ON NVTX ranges starting after its last CUDA call."""
    for pid, ts in last_call.items():
        if int((ranges["start_ns"].to_numpy()[ranges["pid"].to_numpy() == pid] > ts).sum()) >= TRACE_GOES_ON:
            return True
    return False


CALL_STACK_COLUMNS = ["id", "depth", "symbol", "module", "unresolved"]


def read_call_stack_frames(conn: sqlite3.Connection, schema: Schema, chain_ids: np.ndarray) -> pd.DataFrame:
    """The frames of the given call stacks, innermost (depth 0) first: CALL_STACK_COLUMNS, with
    symbol and module names cut to 300 characters; empty when the export has no stack table."""
    if not schema.has("CUDA_CALLCHAINS", "id", "symbol", "module", "stackDepth"):
        return pd.DataFrame(columns=CALL_STACK_COLUMNS)
    unresolved = "c." + _quote("unresolved") if schema.has("CUDA_CALLCHAINS", "unresolved") else "0"
    return read_frame(conn, (
        "SELECT c.id, c.stackDepth, CAST(substr(coalesce(sym.value, ''), 1, 300) AS TEXT), "
        "CAST(substr(coalesce(mdl.value, ''), 1, 300) AS TEXT), "
        f"{unresolved} FROM CUDA_CALLCHAINS AS c "
        "LEFT JOIN StringIds AS sym ON sym.id = c.symbol LEFT JOIN StringIds AS mdl ON mdl.id = c.module "
        f"WHERE c.id IN ({','.join(str(int(i)) for i in chain_ids)}) ORDER BY c.id, c.stackDepth"),
        CALL_STACK_COLUMNS)


# Up to this many API rows, the first and last call of each process come from one exact scan
# (~1 s); beyond, from the table's first and last rows and the memory calls (a GROUP BY over
# 2e7 rows took 22 s, for a comparison that needs the run's ends only to about a sampling interval).
ACTIVITY_SCAN_ROWS = 1_000_000


def read_cuda_activity(conn: sqlite3.Connection, schema: Schema,
                       calls: Optional[pd.DataFrame] = None) -> dict[int, tuple[int, int]]:
    """pid -> (start of its first CUDA API call, end of its last), ns from the session start.

    Made only when a comparison needs to know while a process ran (nvidia-smi logs); {} without
    the API table. In large tables only the first and last TAIL_ROWS rows are read (nsys writes
    rows in time order up to 2025.3), with the memory calls already loaded (`calls`).
    """
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not schema.has(table, "globalTid", "start"):
        return {}
    end = '"end"' if schema.has(table, "end") else "start"
    last_row = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0]
    where = ""
    if isinstance(last_row, int) and last_row > ACTIVITY_SCAN_ROWS:
        where = f"WHERE rowid <= {TAIL_ROWS} OR rowid > {last_row - TAIL_ROWS}"
    sql = f"SELECT (globalTid >> 24) & 16777215, min(start), max({end}) FROM {table} {where} GROUP BY 1"
    spans: dict[int, tuple[int, int]] = {}
    for pid, first, last in conn.execute(sql):
        if isinstance(pid, int) and isinstance(first, int) and isinstance(last, int):
            spans[pid] = (first - schema.time_offset_ns, max(first, last) - schema.time_offset_ns)
    if where and calls is not None and not calls.empty:
        by_pid = calls.groupby("pid")
        for pid, first, last in zip(by_pid["ts_ns"].min().index, by_pid["ts_ns"].min(), by_pid["end_ns"].max()):
            old = spans.get(int(pid), (int(first), int(last)))
            spans[int(pid)] = (min(old[0], int(first)), max(old[1], int(last)))
    return spans


# --- Python backtraces (--python-backtrace=cuda) -------------------------------------------

PYTHON_BACKTRACE_DOMAIN = "Python Backtrace on CUDA"
NVTX_MARK = 34  # NVTX_EVENTS.eventType of an nvtxMark
NVTX_DOMAIN_CREATE = 75  # eventType of the row that names a domain (text = its name)
PAYLOAD_SCHEMA_COLUMNS = ["domain_id", "schema_id", "name", "payload_size"]
PAYLOAD_ENTRY_COLUMNS = ["domain_id", "schema_id", "index", "type", "name", "offset"]
MARK_COLUMNS = ["ts_ns", "pid", "tid", "domain_id", "payload"]


def read_python_backtrace_marks(conn: sqlite3.Connection, schema: Schema) -> pd.DataFrame:
    """The NVTX marks of the "Python Backtrace on CUDA" domain: MARK_COLUMNS, `payload` the raw
    blob (None when the export left it out: `nsys export` without --include-blobs=true)."""
    table = "NVTX_EVENTS"
    if not schema.has(table, "start", "eventType", "globalTid", "domainId", "text"):
        return pd.DataFrame(columns=MARK_COLUMNS)
    # A domain id belongs to one process: the domain's name is on its NvtxDomainCreate row.
    domains = {(int(tid) >> 24 & 0xFFFFFF, int(domain)) for tid, domain in conn.execute(
        f"SELECT globalTid, domainId FROM {table} WHERE eventType = {NVTX_DOMAIN_CREATE} AND text = ?",
        (PYTHON_BACKTRACE_DOMAIN,)) if isinstance(tid, int) and isinstance(domain, int)}
    if not domains:
        return pd.DataFrame(columns=MARK_COLUMNS)
    payload = "binaryData" if schema.has(table, "binaryData") else "NULL"
    ids = ",".join(str(d) for d in sorted({d for _, d in domains}))
    rows = []
    for start, tid, domain, blob in conn.execute(
            f"SELECT start, globalTid, domainId, {payload} FROM {table} "
            f"WHERE eventType = {NVTX_MARK} AND domainId IN ({ids})"):
        if isinstance(start, int) and isinstance(tid, int) and (tid >> 24 & 0xFFFFFF, domain) in domains:
            rows.append((start - schema.time_offset_ns, tid >> 24 & 0xFFFFFF, tid & 0xFFFFFF, domain,
                         bytes(blob) if isinstance(blob, (bytes, memoryview)) else None))
    return pd.DataFrame(rows, columns=MARK_COLUMNS)


def read_payload_schemas(conn: sqlite3.Connection, schema: Schema) -> tuple[pd.DataFrame, pd.DataFrame]:
    """NVTX extended-payload schemas (PAYLOAD_SCHEMA_COLUMNS) and their entries (PAYLOAD_ENTRY_COLUMNS)."""
    if not (schema.has("NVTX_PAYLOAD_SCHEMAS", "domainId", "schemaId", "name", "payloadSize")
            and schema.has("NVTX_PAYLOAD_SCHEMA_ENTRIES", "domainId", "schemaId", "idx", "type", "name", "offset")):
        return pd.DataFrame(columns=PAYLOAD_SCHEMA_COLUMNS), pd.DataFrame(columns=PAYLOAD_ENTRY_COLUMNS)
    schemas = pd.DataFrame(conn.execute(
        "SELECT domainId, schemaId, name, payloadSize FROM NVTX_PAYLOAD_SCHEMAS").fetchall(),
        columns=PAYLOAD_SCHEMA_COLUMNS, dtype=object)  # object: NULL offsets stay None, ids stay exact
    entries = pd.DataFrame(conn.execute(
        'SELECT domainId, schemaId, idx, type, name, "offset" FROM NVTX_PAYLOAD_SCHEMA_ENTRIES').fetchall(),
        columns=PAYLOAD_ENTRY_COLUMNS, dtype=object)
    return schemas, entries


def read_strings(conn: sqlite3.Connection, schema: Schema, ids: np.ndarray) -> dict[int, str]:
    """StringIds values of the given ids (cut to 500 characters)."""
    if len(ids) == 0 or not schema.has("StringIds", "id", "value"):
        return {}
    found = {}
    wanted = [int(i) for i in np.unique(ids)]
    for part in range(0, len(wanted), 50_000):  # SQLite's limit on the length of a statement
        id_list = ",".join(str(i) for i in wanted[part:part + 50_000])
        for string_id, value in conn.execute(
                f"SELECT id, CAST(substr(value, 1, 500) AS TEXT) FROM StringIds WHERE id IN ({id_list})"):
            found[string_id] = str(value)
    return found
