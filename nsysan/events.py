"""Load one normalized frame of every GPU-memory allocation and free from an nsys export.

The memory table (`CUDA_GPU_MEMORY_USAGE_EVENTS`, present with `--cuda-memory-usage=true`) has
sizes, addresses and kinds but only the process; the API table (`CUPTI_ACTIVITY_KIND_RUNTIME`)
has the thread, the API name and the call stack. They are joined on (pid, correlationId) —
correlation ids are unique per process only.

Everything after this module works on the frames it returns; only this module and `schema.py`
know nsys table and column names.

EVENT_COLUMNS (one row per allocation or free, in time order; frees before allocations at the
same timestamp, so a peak is never overstated; the row position is the event's sequence number):
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Callable, Optional

import numpy as np
import pandas as pd

from . import apis
from .errors import NsysanError
from .model import KINDS, Diagnostic
from .export import connect_readonly
from .reader import PARALLEL_MIN_ROWS, database_path, read_frame, read_table, release_memory, usable_cpus
from .schema import Schema, _quote

EVENT_COLUMNS = {
    "ts_ns": "int64",  # start of the event, ns from the session start
    "pid": "int32",
    "tid": "int32",  # thread of the API call (-1 when the event has none, e.g. module statics)
    "device": "int16",  # CUDA device ordinal in that process
    "kind": "category",  # device | array | static | managed | managed_static | pinned | pageable | unknown
    "op": "category",  # alloc | free
    "api": "category",  # cudaMalloc, cuMemSetAccess, ... (version suffix stripped)
    "address": "uint64",
    "bytes": "int64",  # size of the block (for a free: the size of its allocation)
    "delta_bytes": "int64",  # +bytes for an alloc, -bytes for a matched free, 0 for an unmatched free
    "correlation_id": "int64",
    "pool": "bool",  # stream-ordered allocation from a memory pool (cudaMallocAsync)
    "partner": "int64",  # row of the matching free (for an alloc) or alloc (for a free); -1 if none
    "nvtx_range": "category",  # innermost NVTX push/pop range open on the thread, "" if none
    "nvtx_path": "category",  # all ranges open on it, outermost first, joined by " > "
    "site": "category",  # call-site label (see `sites` in LoadedEvents)
}
__doc__ += "\n".join(f"    {name}: {dtype}" for name, dtype in EVENT_COLUMNS.items())

CALL_COLUMNS = {
    "ts_ns": "int64", "end_ns": "int64", "pid": "int32", "tid": "int32", "api": "category",
    "family": "category", "return_value": "int32", "correlation_id": "int64",
    "has_event": "bool",  # the call caused at least one memory event
}

SITE_COLUMNS = ["label", "function", "symbol", "module", "from_stack"]

# Push/pop ranges belong to one thread (59 NvtxPushPopRange, 70 NvtxtPushPopRange); start/end
# ranges (60, 71) may cross threads and are not used to attribute events.
NVTX_PUSH_POP = (59, 70)
NVTX_NAME_CHARS = 200  # NVTX texts can be megabytes; names are cut here, in SQL.
MAX_NVTX_DEPTH = 64

Progress = Callable[[str, float], None]


@dataclass
class LoadedEvents:
    """Frames from one export: memory events, memory API calls, NVTX ranges and call sites."""

    events: pd.DataFrame  # EVENT_COLUMNS
    calls: pd.DataFrame  # CALL_COLUMNS: every memory API call (not the backtrace twin rows)
    ranges: pd.DataFrame  # NVTX push/pop ranges: pid, tid, start_ns, end_ns, name, depth, parent
    sites: pd.DataFrame  # label -> function, symbol, module, from_stack
    thread_names: dict[tuple[int, int], str]
    # pid -> end of its last CUDA API call of any kind, for the processes whose NVTX ranges go
    # on after their last memory call (see `_last_cuda_calls`)
    last_cuda_call_ns: dict[int, int] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    quick: bool = False  # only the memory-usage table was read (see load_events)


def load_events(conn: sqlite3.Connection, schema: Schema, progress: Optional[Progress] = None, *,
                quick: bool = False) -> LoadedEvents:
    """Read and normalize the export's memory events, API calls and NVTX ranges.

    `quick` reads the memory-usage table alone: the events keep their times, processes, devices,
    kinds, sizes and pairs, but have no thread, API name, NVTX range or call site (see QUICK_API).
    """
    try:
        load = _load_quick if quick else _load
        return load(conn, schema, progress or (lambda stage, fraction: None))
    except sqlite3.DatabaseError as err:
        raise NsysanError(f"the export could not be read ({err}); it may be truncated or damaged") from err


def _load(conn: sqlite3.Connection, schema: Schema, progress: Progress) -> LoadedEvents:
    diagnostics: list[Diagnostic] = []
    thread_names = _read_thread_names(conn, schema)
    progress("reading memory events and API calls", 0.0)
    # The two big tables are read at the same time: the driver releases the GIL while SQLite
    # scans, so on two cores this halves the longest part of a large analysis (measured: 1.18 s
    # -> 0.60 s for both reads of the 1e6-event benchmark export).
    with ThreadPoolExecutor(max_workers=1) as pool:
        memory_rows = pool.submit(_read_memory_events_alone, conn, schema)
        calls, chains = _read_calls(conn, schema)
        ranges = _read_nvtx_ranges(conn, schema)
        raw = memory_rows.result()
    # No release_memory() here: the reads convert batch by batch, so little is left to give
    # back, and what malloc_trim gives back is faulted in again by the normalizing just after
    # (1e7 events, command line: 0.6 s, for 15 MB less peak). After it, the raw columns are gone.
    progress("matching allocations and frees", 0.5)
    events = _normalize(raw, calls, chains, schema, diagnostics)
    del raw
    release_memory()
    progress("attributing NVTX ranges and sites", 0.8)
    events["nvtx_range"], events["nvtx_path"] = attribute_ranges(events, ranges)
    sites, labels = _call_sites(conn, schema, events, chains, thread_names, diagnostics)
    events["site"] = labels
    events = events[list(EVENT_COLUMNS)]
    last_calls = _last_cuda_calls(conn, schema, calls, ranges)
    progress("done", 1.0)
    return LoadedEvents(events=events, calls=calls, ranges=ranges, sites=sites, thread_names=thread_names,
                        last_cuda_call_ns=last_calls, diagnostics=diagnostics)


# The API name of every event in a quick load, whose API table is not read.
QUICK_API = "(not read)"


def _load_quick(conn: sqlite3.Connection, schema: Schema, progress: Progress) -> LoadedEvents:
    if not schema.memory_usage_collected:
        raise NsysanError("--quick reads only the memory-usage table, and this export has none (capture with "
                          "--cuda-memory-usage=true); run without --quick to count the memory API calls")
    diagnostics: list[Diagnostic] = []
    progress("reading memory events", 0.0)
    # correlationId too: no API call is joined, but it tells two real events at the same time,
    # address and size from a row written twice (see _without_copies)
    raw = _read_memory_events(conn, schema)
    progress("matching allocations and frees", 0.5)  # no release_memory() yet: see _load
    events = _normalize(raw, _empty_calls(), _empty_chains(), schema, diagnostics, no_call=QUICK_API)
    del raw
    release_memory()
    blank = pd.Categorical.from_codes(np.zeros(len(events), "int8"), categories=[""])
    events["nvtx_range"] = events["nvtx_path"] = events["site"] = blank
    progress("done", 1.0)
    return LoadedEvents(events=events[list(EVENT_COLUMNS)], calls=_empty_calls(), ranges=_empty_ranges(),
                        sites=_empty_sites(), thread_names={}, diagnostics=diagnostics, quick=True)


# --- reading -------------------------------------------------------------------------------

def _ints(frame: pd.DataFrame, column: str) -> pd.Series:
    """A column as nullable integers: NULLs and non-numbers (damaged exports) become <NA>.

    Never goes through float64 when the values are integers: globalTid needs all 64 bits.
    """
    values = frame[column]
    if values.dtype.kind in "iu":
        return values.astype("Int64")
    numbers = pd.to_numeric(values, errors="coerce", dtype_backend="numpy_nullable")
    if numbers.dtype.kind in "iu" or str(numbers.dtype) in ("Int64", "UInt64"):
        return numbers.astype("Int64")
    floats = numbers.astype("Float64").to_numpy(dtype="float64", na_value=np.nan)
    finite = np.isfinite(floats)
    out = pd.array(np.where(finite, np.clip(floats, -2.0**62, 2.0**62), 0).astype("int64"), dtype="Int64")
    out[~finite] = pd.NA
    return pd.Series(out, index=values.index)


def _int_column(frame: pd.DataFrame, column: str, dtype: str = "int64", fill: int = 0) -> np.ndarray:
    """A column as a plain integer array, NULLs and non-numbers replaced by `fill`."""
    values = frame[column]
    # The common case: no NULLs, no copy. Not for pandas' nullable Int64 (also kind "i"), whose
    # NULLs would become garbage integers.
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iu":
        return values.to_numpy().astype(dtype, copy=False)
    return _ints(frame, column).to_numpy(dtype=dtype, na_value=fill)


def _col(schema: Schema, table: str, column: str, default: str = "NULL") -> str:
    return _quote(column) if schema.has(table, column) else default


def _read_thread_names(conn: sqlite3.Connection, schema: Schema) -> dict[tuple[int, int], str]:
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


def _read_calls(conn: sqlite3.Connection, schema: Schema) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Memory API calls, and the call stack id of each (pid, correlationId) that has one."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    empty_chains = _empty_chains()
    if not schema.has(table, "start", "nameId", "globalTid", "correlationId"):
        return _empty_calls(), empty_chains
    name_ids = _memory_api_ids(conn, schema)
    if not name_ids:
        return _empty_calls(), empty_chains
    id_list = ",".join(str(i) for i in sorted(name_ids))
    # Backtrace twin rows (eventClass 67) and call stacks exist only with CUDA_CALLCHAINS; without
    # it, those two columns are not read at all (the largest read of a big export).
    stacks = schema.has_backtraces
    columns = ["start", "end", "global_tid", "correlation_id", "name_id", "return_value"]
    select = (f"start, {_col(schema, table, 'end', 'start')}, globalTid, correlationId, nameId, "
              f"{_col(schema, table, 'returnValue', '0')}")
    if stacks:
        columns += ["event_class", "callchain_id"]
        select += f", {_col(schema, table, 'eventClass', '0')}, {_col(schema, table, 'callchainId')}"
    raw = read_table(conn, table, select, columns, where=f"nameId IN ({id_list})")
    global_tid = _int_column(raw, "global_tid")
    pid = ((global_tid >> 24) & 0xFFFFFF).astype("int32")
    correlation = _int_column(raw, "correlation_id")
    chains, real = empty_chains, np.ones(len(raw), bool)
    if stacks:
        chain = _ints(raw, "callchain_id")
        has_chain = chain.notna().to_numpy()
        chains = pd.DataFrame({"pid": pid[has_chain], "correlation_id": correlation[has_chain],
                               "callchain_id": chain[has_chain].to_numpy(dtype="int64")})
        # One stack per call: with --cudabacktrace, 2025.x writes a twin row (eventClass 67) that
        # carries it; older exports put it on the call's own row.
        chains = chains.groupby(["pid", "correlation_id"], as_index=False)["callchain_id"].max()
        real = _int_column(raw, "event_class") != 67  # the twins duplicate calls: never count or time them
    api = categorical_lookup(_int_column(raw, "name_id")[real], name_ids)
    family = categorical_lookup(api.codes, dict(enumerate(apis.FAMILIES.get(a, "other") for a in api.categories)))
    start = _int_column(raw, "start")[real] - schema.time_offset_ns
    end = _int_column(raw, "end")[real] - schema.time_offset_ns
    calls = pd.DataFrame({
        "ts_ns": start, "end_ns": np.maximum(end, start), "pid": pid[real],
        "tid": (global_tid[real] & 0xFFFFFF).astype("int32"), "api": api, "family": family,
        "return_value": np.clip(_int_column(raw, "return_value")[real], -2**31, 2**31 - 1).astype("int32"),
        "correlation_id": correlation[real], "has_event": np.zeros(int(real.sum()), bool),
    }, copy=False)  # pandas copies a dict's arrays by default: 0.7 s at 1e7 calls
    return calls, chains


def categorical_lookup(values: np.ndarray, lookup: dict, missing: str = "?") -> pd.Categorical:
    """`lookup[v]` for every value, as a categorical: one dictionary lookup per distinct value."""
    values = np.asarray(values)
    if values.dtype.kind in "iu" and len(values) and 0 <= values.min() and values.max() < 1 << 16:
        # Enum and string ids: a count per value finds the distinct ones, and a table maps them,
        # without pandas' hash pass (0.2 s per 1e7 values)
        uniques = np.flatnonzero(np.bincount(values))
        code_of = np.zeros(int(uniques[-1]) + 1, "int32")
        code_of[uniques] = np.arange(len(uniques), dtype="int32")
        codes = code_of[values]
    else:
        codes, uniques = pd.factorize(values)
    names = [lookup.get(u.item() if hasattr(u, "item") else u, missing) for u in uniques]
    categories = list(dict.fromkeys(names))  # several values may share a name
    position = {name: i for i, name in enumerate(categories)}
    remap = np.array([position[n] for n in names], dtype="int64")
    return pd.Categorical.from_codes(remap[codes] if len(codes) else codes, categories=categories)


def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in CALL_COLUMNS.items()})


def _empty_chains() -> pd.DataFrame:
    return pd.DataFrame({"pid": np.zeros(0, "int32"), "correlation_id": np.zeros(0, "int64"),
                         "callchain_id": np.zeros(0, "int64")})


def _empty_ranges() -> pd.DataFrame:
    return pd.DataFrame({"pid": pd.Series(dtype="int32"), "tid": pd.Series(dtype="int32"),
                         "start_ns": pd.Series(dtype="int64"), "end_ns": pd.Series(dtype="int64"),
                         "name": pd.Series(dtype="object"), "depth": pd.Series(dtype="int16"),
                         "parent": pd.Series(dtype="int64")})


def _empty_sites() -> pd.DataFrame:
    return pd.DataFrame(columns=SITE_COLUMNS)


def _read_memory_events_alone(conn: sqlite3.Connection, schema: Schema) -> pd.DataFrame:
    """_read_memory_events on a connection of its own (it runs on another thread)."""
    path = database_path(conn)
    if path is None:  # an in-memory database: share the connection, serially
        return _read_memory_events(conn, schema)
    with contextlib.closing(connect_readonly(Path(path))) as own:
        return _read_memory_events(own, schema)


def _read_memory_events(conn: sqlite3.Connection, schema: Schema) -> pd.DataFrame:
    table = "CUDA_GPU_MEMORY_USAGE_EVENTS"
    # A full scan returns rows in rowid (export) order, which the stable sort keeps for ties.
    columns = ["start", "global_pid", "device", "address", "bytes", "mem_kind", "op_type", "correlation_id",
               "pool_address"]
    if not schema.memory_usage_collected:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    select = (f"start, globalPid, {_col(schema, table, 'deviceId', '0')}, address, bytes, "
              f"{_col(schema, table, 'memKind', '2')}, {_col(schema, table, 'memoryOperationType', '0')}, "
              f"{_col(schema, table, 'correlationId', '0')}, "
              f"{_col(schema, table, 'localMemoryPoolAddress')} IS NOT NULL")
    return read_table(conn, table, select, columns)


def _read_nvtx_ranges(conn: sqlite3.Connection, schema: Schema) -> pd.DataFrame:
    """Push/pop NVTX ranges with their nesting depth (1 = outermost on that thread) and the row of
    the range that encloses each (-1 for outermost ones)."""
    table = "NVTX_EVENTS"
    empty = _empty_ranges()
    if not schema.has(table, "start", "eventType", "globalTid"):
        return empty
    text = "n." + _quote("text") if schema.has(table, "text") else "NULL"
    # CAST: a BLOB where text belongs (damaged exports) is read as text, bad bytes replaced.
    if schema.has(table, "textId") and schema.has("StringIds", "id", "value"):
        # A message registered with nvtxDomainRegisterString is in textId, otherwise in text.
        name_sql = f"CAST(substr(coalesce({text}, s.value, ''), 1, {NVTX_NAME_CHARS}) AS TEXT)"
        join = "LEFT JOIN StringIds AS s ON s.id = n.textId"
    else:
        name_sql = f"CAST(substr(coalesce({text}, ''), 1, {NVTX_NAME_CHARS}) AS TEXT)"
        join = ""
    end = "n." + _quote("end") if schema.has(table, "end") else "NULL"  # not "n.NULL": a syntax error
    types = ",".join(str(t) for t in NVTX_PUSH_POP)
    sql = (f"SELECT n.start, {end}, n.globalTid, {name_sql} FROM {table} AS n {join} "
           f"WHERE n.eventType IN ({types})")
    raw = read_frame(conn, sql, ["start", "end", "global_tid", "name"])
    if raw.empty:
        return empty
    global_tid = _int_column(raw, "global_tid")
    start = _int_column(raw, "start") - schema.time_offset_ns
    end_values = _ints(raw, "end")
    # An unterminated range (end NULL) stays open to the end of the capture.
    open_end = np.iinfo("int64").max // 2
    end = np.where(end_values.isna().to_numpy(), open_end,
                   end_values.fillna(0).to_numpy(dtype="int64") - schema.time_offset_ns)
    ranges = pd.DataFrame({
        "pid": ((global_tid >> 24) & 0xFFFFFF).astype("int32"), "tid": (global_tid & 0xFFFFFF).astype("int32"),
        "start_ns": start, "end_ns": np.maximum(end, start),
        "name": raw["name"].fillna("").astype(str).str.replace(r"\s+", " ", regex=True),
    })
    ranges = ranges.sort_values(["pid", "tid", "start_ns", "end_ns"], ascending=[True, True, True, False],
                                kind="stable", ignore_index=True)
    ranges["depth"] = _nesting_depth(ranges)
    # Ranges are sorted per thread by start, the order _parents expects.
    ranges["parent"] = _parents(ranges, np.arange(len(ranges)),
                                _thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy()),
                                ranges["depth"].to_numpy().astype("int64"))
    return ranges


def _nesting_depth(ranges: pd.DataFrame) -> np.ndarray:
    """Depth of each range among the ranges open on its thread when it starts (1 = outermost)."""
    n = len(ranges)
    if n == 0:
        return np.zeros(0, "int16")
    # Boundaries: +1 at each start, -1 at each end, in time order per thread; at equal times an
    # end comes before a start so that back-to-back ranges are siblings, not nested.
    thread = ranges["pid"].to_numpy().astype("int64") << 24 | ranges["tid"].to_numpy().astype("int64")
    times = np.concatenate([ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()])
    steps = np.concatenate([np.ones(n, "int64"), -np.ones(n, "int64")])
    owners = np.concatenate([np.arange(n), np.arange(n)])
    threads = np.concatenate([thread, thread])
    order = np.lexsort((owners * 0 + (steps > 0), times, threads))  # thread, time, ends first
    open_count = pd.Series(steps[order]).groupby(threads[order]).cumsum().to_numpy()
    depth = np.zeros(n, "int64")
    is_start = steps[order] > 0
    depth[owners[order][is_start]] = open_count[is_start]
    return np.clip(depth, 1, np.iinfo("int16").max).astype("int16")


TAIL_ROWS = 200_000
TRACE_GOES_ON = 3  # NVTX ranges starting after a process's last CUDA call that mean "incomplete"


def _last_cuda_calls(conn: sqlite3.Connection, schema: Schema, calls: pd.DataFrame,
                     ranges: pd.DataFrame) -> dict[int, int]:
    """When each process's CUDA trace ends (end of its last API call of any kind).

    A trace that stops while the process visibly goes on (NVTX ranges later) lost its end: a
    crash before nsys flushed, or an nsys too old for the driver. The full answer needs a scan
    of the whole API table, so it is computed only for processes that look suspicious from the
    memory calls and the last rows of the table (nsys writes rows in time order up to 2025.3).
    """
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if ranges.empty or not schema.has(table, "globalTid", "start"):
        return {}
    end = '"end"' if schema.has(table, "end") else "start"
    last = calls.groupby("pid")["end_ns"].max().to_dict() if not calls.empty else {}

    def merge(where: str) -> None:
        sql = f"SELECT (globalTid >> 24) & 16777215, max({end}) FROM {table} {where} GROUP BY 1"
        for pid, ts in conn.execute(sql):
            if isinstance(pid, int) and isinstance(ts, int):
                last[pid] = max(last.get(pid, ts - schema.time_offset_ns), ts - schema.time_offset_ns)

    merge(f"WHERE rowid > (SELECT max(rowid) FROM {table}) - {TAIL_ROWS}")
    if _ranges_after(last, ranges):
        merge("")  # the whole table, only when the tail leaves a process looking cut short
    return last


def _ranges_after(last_call: dict[int, int], ranges: pd.DataFrame) -> bool:
    """Whether some process has TRACE_GOES_ON NVTX ranges starting after its last CUDA call."""
    for pid, ts in last_call.items():
        if int((ranges["start_ns"].to_numpy()[ranges["pid"].to_numpy() == pid] > ts).sum()) >= TRACE_GOES_ON:
            return True
    return False


# --- normalizing ---------------------------------------------------------------------------

def _normalize(raw: pd.DataFrame, calls: pd.DataFrame, chains: pd.DataFrame, schema: Schema,
               diagnostics: list[Diagnostic], no_call: str = "(no API call)") -> pd.DataFrame:
    """The events frame: decoded, joined to API calls, in canonical order, allocs paired with frees.

    Consumes `raw`: its columns are dropped as they are used, so that a 10-million-event export
    never holds the raw and the normalized frame whole at the same time. Also marks in `calls`
    which calls caused a memory event (`has_event`). Events without a call get the API name
    `no_call`.
    """
    if raw.empty:
        return _empty_events()

    def take(column: str) -> tuple[np.ndarray, np.ndarray]:
        values = _ints_and_nulls(raw, column)
        del raw[column]
        return values

    ts, ts_bad = take("start")
    global_pid, pid_bad = take("global_pid")
    size, size_bad = take("bytes")
    op_id, op_bad = take("op_type")
    op_code = np.full(len(op_id), -1, "int8")  # 0 alloc, 1 free
    for enum_id, name in schema.mem_ops.items():
        op_code[op_id == enum_id] = 0 if name == "alloc" else 1
    del op_id
    # Sizes beyond 1 PiB or below zero are not real allocations (damaged or hostile exports);
    # they would also overflow the running sums. Times are clipped for the same reason.
    bad = ts_bad | pid_bad | size_bad | op_bad | (op_code < 0) | (size < 0) | (size > 2**50) | (np.abs(ts) > 2**61)
    address, address_bad = take("address")
    bad |= address_bad
    del ts_bad, pid_bad, size_bad, op_bad, address_bad
    if bad.any():
        diagnostics.append(Diagnostic(
            "warning", "bad_memory_rows",
            f"{int(bad.sum())} memory events had missing or impossible values (unknown operation, "
            "size below 0 or above 1 PiB, NULL time or address) and were left out"))
    # Canonical order: time, then frees before allocs (a peak is never overstated by a free and
    # an alloc recorded at the same ns, and a block freed and handed out again in the same ns
    # pairs correctly), then the export's row order (a stable sort). nsys 2025.6 no longer writes
    # rows in time order, so the export's order is never relied on alone; it is nearly sorted in
    # older versions, which the stable sort exploits.
    kept = np.flatnonzero(~bad) if bad.any() else None  # None: every row
    del bad
    key = (ts if kept is None else ts[kept]) - schema.time_offset_ns
    key *= 2
    key += (op_code if kept is None else op_code[kept]) == 0
    by_key = None if (key[1:] >= key[:-1]).all() else np.argsort(key, kind="stable")
    # Exports are nearly in this order: when the sort moves few rows, it is applied in place to
    # those rows of each column instead of gathering every column (0.3 s less at 1e7 events).
    moved = _moved_rows(by_key) if kept is None else None
    if by_key is not None:
        key = _permuted(key, by_key, moved)
    order = by_key if kept is None else kept if by_key is None else kept[by_key]
    del kept, by_key
    whole = order
    order = _without_copies(order, key, ts, op_code, global_pid, address, size, raw, diagnostics)
    del key
    if order is not whole:  # copies left out: no longer a reordering of every row
        moved = None

    def reorder(values: np.ndarray) -> np.ndarray:
        # order None: every row, in the export's order, so each column is used as it was read
        return values if order is None else _permuted(values, order, moved)

    frame = pd.DataFrame({"ts_ns": reorder(ts) - schema.time_offset_ns}, copy=False)
    del ts
    pid = ((reorder(global_pid) >> 24) & 0xFFFFFF).astype("int32")
    del global_pid
    is_alloc = reorder(op_code) == 0
    del op_code
    correlation = reorder(take("correlation_id")[0])
    kind_ids = _int_column(raw, "mem_kind", fill=7)
    del raw["mem_kind"]
    kind = categorical_lookup(reorder(kind_ids), schema.mem_kinds, missing="unknown")
    del kind_ids
    kind = kind.set_categories([k for k in KINDS if k in kind.categories] +
                               [k for k in kind.categories if k not in KINDS])

    frame["pid"] = pid
    frame["device"] = np.clip(reorder(take("device")[0]), -1, 32767).astype("int16")
    frame["kind"] = kind
    frame["op"] = pd.Categorical.from_codes(is_alloc.view("int8") ^ 1, categories=["alloc", "free"])
    statics = kind.codes == (list(kind.categories).index("static") if "static" in kind.categories else -2)
    api_names = list(calls["api"].cat.categories) + ["(module load)", no_call]
    if len(calls):
        # Thread, API name and call stack come from the API call that caused the event.
        call_row = _join_on_call(pid, correlation, calls["pid"].to_numpy(), calls["correlation_id"].to_numpy())
        found = call_row >= 0
        calls["has_event"] = np.bincount(call_row[found], minlength=len(calls)).astype(bool)
        frame["tid"] = _take(calls["tid"].to_numpy(), call_row, -1).astype("int32")
        api_codes = _take(calls["api"].cat.codes.to_numpy().astype("int64"), call_row, -1)
        api_codes = np.where(found, api_codes, np.where(statics, len(api_names) - 2, len(api_names) - 1))
        del call_row, found
    else:  # no API calls (or not read): one pass instead of a join that finds nothing
        frame["tid"] = np.full(len(pid), -1, "int32")
        api_codes = np.where(statics, len(api_names) - 2, len(api_names) - 1)
    del statics
    frame["api"] = _categorical_of_used(api_codes, api_names)
    del api_codes
    frame["address"] = reorder(address).astype("uint64")
    del address
    frame["correlation_id"] = correlation
    frame["pool"] = reorder(take("pool_address")[0]) != 0
    if len(chains):
        chain_row = _join_on_call(pid, correlation, chains["pid"].to_numpy(), chains["correlation_id"].to_numpy())
        frame["callchain_id"] = _take(chains["callchain_id"].to_numpy(), chain_row, -1)
        del chain_row
    else:
        frame["callchain_id"] = np.full(len(pid), -1, "int64")
    del correlation

    partner, overlapping = _pair_allocs_and_frees(pid, frame["address"].to_numpy(), is_alloc)
    if overlapping:
        diagnostics.append(Diagnostic(
            "warning", "overlapping_allocations",
            f"{overlapping} allocations were followed by another allocation at the same address while "
            "still allocated (a free is missing from the capture, or the export is damaged); each "
            "free closes the latest allocation at its address, so the live bytes may be overstated"))
    alloc_bytes = reorder(size)
    del size, order
    # A free takes the size of its allocation (older exports leave bytes 0 on free rows); a free
    # with no allocation in the capture changes nothing we counted.
    freed_size = np.where(partner >= 0, alloc_bytes[np.maximum(partner, 0)], alloc_bytes)
    frame["bytes"] = np.where(is_alloc, alloc_bytes, freed_size)
    frame["delta_bytes"] = np.where(is_alloc, alloc_bytes, np.where(partner >= 0, -freed_size, 0))
    frame["partner"] = partner
    return frame


def _without_copies(order: np.ndarray, key: np.ndarray, ts: np.ndarray, op_code: np.ndarray,
                    global_pid: np.ndarray, address: np.ndarray, size: np.ndarray, raw: pd.DataFrame,
                    diagnostics: list[Diagnostic]) -> np.ndarray:
    """`order` (rows in canonical order; `key`, their sort keys) without the rows that repeat an
    earlier row exactly.

    An export written twice into one file (`nsys export --append`) holds every event twice, which
    would double the peak and turn every free into an orphan. No two real events are identical
    (same time, process, device, address, size, kind, operation and API call). Only rows that
    share their time and operation with a neighbour in `order` can be copies, so the full
    comparison runs on those few.
    """
    if len(key) < 2:
        return order
    equal_next = key[1:] == key[:-1]
    if not equal_next.any():
        return order
    tied = np.zeros(len(key), bool)
    tied[1:] |= equal_next
    tied[:-1] |= equal_next
    rows = np.flatnonzero(tied) if order is None else order[tied]  # canonical order: the first copy is kept
    subset = raw.iloc[rows]
    copies = pd.DataFrame({
        "ts": ts[rows], "op": op_code[rows], "pid": global_pid[rows], "address": address[rows], "bytes": size[rows],
        **{column: _int_column(subset, column, fill=-1) for column in ("device", "mem_kind", "correlation_id")},
    }).duplicated().to_numpy()
    if not copies.any():
        return order
    diagnostics.append(Diagnostic(
        "warning", "bad_memory_rows",
        f"{int(copies.sum())} memory events were exact copies of others (an export written twice into one "
        "file?) and were left out"))
    drop = np.zeros(len(ts), bool)
    drop[rows[copies]] = True
    return np.flatnonzero(~drop) if order is None else order[~drop[order]]


def _moved_rows(order: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """The rows a reordering of every row moves, when they are few (else None)."""
    if order is None:
        return None
    moved = np.flatnonzero(order != np.arange(len(order)))
    return moved if len(moved) <= len(order) // 64 else None


def _permuted(values: np.ndarray, order: np.ndarray, moved: Optional[np.ndarray]) -> np.ndarray:
    """values[order]; with `moved` (the rows order moves), done in place on those rows alone.

    Only for arrays nothing else reads any more: the columns taken out of the raw frame (pandas
    hands them out read-only; the data are ours once the frame has let go of them).
    """
    if moved is None:
        return values[order]
    if not values.flags.writeable:
        try:
            values.flags.writeable = True
        except ValueError:  # memory we do not own: a copy, then in place
            values = values.copy()
    values[moved] = values[order[moved]]  # the right side is gathered before anything is written
    return values


def _categorical_of_used(codes: np.ndarray, categories: list) -> pd.Categorical:
    """categories[codes] as a categorical with only the categories in use: a count per code
    instead of pandas' hash pass over every value (0.4 s at 1e7 events)."""
    used = np.bincount(codes, minlength=len(categories)) > 0
    new_code = (np.cumsum(used) - 1).astype("int32")
    return pd.Categorical.from_codes(new_code[codes], categories=[c for c, u in zip(categories, used) if u])


def _take(values: np.ndarray, rows: np.ndarray, fill: int) -> np.ndarray:
    """values[rows], with `fill` where rows is -1 (no match)."""
    if len(values) == 0:
        return np.full(len(rows), fill, dtype="int64")
    return np.where(rows >= 0, values[np.maximum(rows, 0)], fill)


def _ints_and_nulls(frame: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A column as int64 (NULLs as 0) and the mask of its NULLs."""
    dtype = frame[column].dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "iu":  # plain numpy ints: no NULLs
        return _int_column(frame, column), np.zeros(len(frame), bool)
    values = _ints(frame, column)
    return values.to_numpy(dtype="int64", na_value=0), values.isna().to_numpy()


def _join_on_call(pid: np.ndarray, correlation: np.ndarray, call_pid: np.ndarray,
                  call_correlation: np.ndarray) -> np.ndarray:
    """Row of the call with the same (pid, correlationId) for each event, -1 if none.

    correlationId is unique per process only; ids of 0 or less (module statics, damaged exports)
    never match. The first call of a key wins.
    """
    result = np.full(len(pid), -1, "int64")
    if len(call_pid) == 0 or len(pid) == 0:
        return result
    # Per process (a counting sort brings each process's calls together, still in export order),
    # correlation ids nearly always come in increasing order, so a binary search needs no sort.
    call_codes, call_pids = pd.factorize(call_pid)
    call_order = group_order(call_codes.astype("int64"), len(call_pids))
    call_bounds = np.searchsorted(call_codes[call_order], np.arange(len(call_pids) + 1))
    event_codes = pd.Index(call_pids).get_indexer(pid) + 1  # 0: a process with no calls at all
    event_order = group_order(event_codes.astype("int64"), len(call_pids) + 1)
    event_bounds = np.searchsorted(event_codes[event_order], np.arange(len(call_pids) + 2))
    for code in range(len(call_pids)):  # one per process
        rows = call_order[call_bounds[code]:call_bounds[code + 1]]
        keys = call_correlation[rows]
        if len(keys) > 1 and not (keys[1:] >= keys[:-1]).all():
            by_key = np.argsort(keys, kind="stable")  # out of order: sort (first call of a key wins)
            rows, keys = rows[by_key], keys[by_key]
        mine = event_order[event_bounds[code + 1]:event_bounds[code + 2]]
        wanted = correlation[mine]
        at = np.clip(np.searchsorted(keys, wanted, side="left"), 0, len(keys) - 1)
        hit = (keys[at] == wanted) & (wanted > 0)  # correlation id 0: no call (module statics)
        result[mine[hit]] = rows[at[hit]]
    return result


def _empty_events() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype=t) for c, t in EVENT_COLUMNS.items()})
    frame["callchain_id"] = pd.Series(dtype="int64")
    return frame


def _pair_allocs_and_frees(pid: np.ndarray, address: np.ndarray, is_alloc: np.ndarray) -> tuple[np.ndarray, int]:
    """For each event, the row of its partner: an alloc's free, a free's alloc (-1 if none); and
    how many allocations were followed by another one at their address while still allocated.

    Events are in canonical time order. Addresses are reused, so pairing is by order per
    (process, address): a free closes the allocation immediately before it at that address. A
    free after a free, or first at its address, has no allocation in the capture (allocated
    before it started). Two allocations in a row at one address mean a free was lost.
    """
    n = len(pid)
    partner = np.full(n, -1, "int64")
    if n == 0:
        return partner, 0
    pid_code, pids = pd.factorize(pid)
    address = address.astype("uint64", copy=False)
    if len(pids) < 2**15 and (address >> np.uint64(48)).max() == 0:
        # User-space addresses have at most 48 bits (x86-64, ARM64): process and address fit in
        # one 64-bit key, so a single hash pass numbers the blocks.
        block_code, blocks = factorize_in_parts(address | (pid_code.astype("uint64") << np.uint64(48)))
    else:  # damaged exports with wider addresses or absurd pid counts: two passes
        address_code, _ = pd.factorize(address)
        block_code, blocks = pd.factorize(address_code.astype("int64") * len(pids) + pid_code)
    previous = previous_in_group(block_code, len(blocks))  # the event before, at the same block
    after_alloc = (previous >= 0) & is_alloc[np.maximum(previous, 0)]
    # a free pairs with the event before it at its block when that one is an alloc
    frees = np.flatnonzero(~is_alloc & after_alloc)
    partner[frees] = previous[frees]
    partner[previous[frees]] = frees
    return partner, int((is_alloc & after_alloc).sum())


def factorize_in_parts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pd.factorize(values) up to the numbering of the codes, on every usable core.

    pandas hashes without the GIL, so each thread numbers its own slice; the slices' distinct
    values (few next to the rows) are then numbered once more into one set of codes. 0.6 s ->
    0.3 s for 1e7 values on two cores.
    """
    parts = usable_cpus() if len(values) >= PARALLEL_MIN_ROWS else 1
    if parts == 1:
        return pd.factorize(values)
    edges = np.linspace(0, len(values), parts + 1).astype("int64")
    with ThreadPoolExecutor(max_workers=parts) as pool:
        done = list(pool.map(lambda i: pd.factorize(values[edges[i]:edges[i + 1]]), range(parts)))
    # Each slice's distinct values, numbered again across slices.
    renumber, uniques = pd.factorize(np.concatenate([part_uniques for _, part_uniques in done]))
    codes = np.empty(len(values), "int64")
    offset = 0
    for i, (part_codes, part_uniques) in enumerate(done):
        codes[edges[i]:edges[i + 1]] = renumber[offset:offset + len(part_uniques)][part_codes]
        offset += len(part_uniques)
    return codes, uniques


def previous_in_group(codes: np.ndarray, groups: int) -> np.ndarray:
    """For each row, the row before it with the same code (0 <= code < groups), -1 for the first:
    one pass that remembers each group's last row (pandas' groupby shift), instead of sorting
    1e7 rows into groups and back (measured 0.3 s against 0.9 s)."""
    codes = codes.astype(np.intp, copy=False)
    previous = np.empty(len(codes), "int64")
    try:
        from pandas._libs.groupby import group_shift_indexer
        group_shift_indexer(previous, codes, groups, 1)
    except (ImportError, TypeError, ValueError):  # pragma: no cover - a pandas without it
        order = group_order(codes, groups)
        in_order = codes[order]
        previous[order[0]] = -1
        previous[order[1:]] = np.where(in_order[1:] == in_order[:-1], order[:-1], -1)
    return previous


def group_order(codes: np.ndarray, groups: int) -> np.ndarray:
    """A stable order that brings equal codes (0 <= code < groups) together: a counting sort,
    O(n) instead of the O(n log n) of a comparison sort on 1e7 events."""
    try:
        from pandas.core.sorting import get_group_index_sorter
    except ImportError:  # pragma: no cover - a pandas without it
        return np.argsort(codes, kind="stable")
    return get_group_index_sorter(codes.astype(np.intp, copy=False), groups)


# --- NVTX attribution ----------------------------------------------------------------------

def attribute_ranges(points: pd.DataFrame, ranges: pd.DataFrame) -> tuple[pd.Categorical, pd.Categorical]:
    """Innermost NVTX range and range path open at each point (columns pid, tid, ts_ns).

    Looks on the point's own thread first, then on the process's main thread (tid == pid):
    PyTorch runs backward passes on autograd threads that have no ranges of their own.
    """
    n = len(points)
    if n == 0 or ranges.empty:
        empty = pd.Categorical.from_codes(np.zeros(n, "int8"), categories=[""])
        return empty, empty
    pid, ts = points["pid"].to_numpy(), points["ts_ns"].to_numpy()
    index = _innermost(pid, points["tid"].to_numpy(), ts, ranges)
    missing = np.flatnonzero(index < 0)
    if len(missing):
        index[missing] = _innermost(pid[missing], pid[missing], ts[missing], ranges)
    return _as_categorical(ranges["name"].to_numpy(dtype=object), index), \
        _as_categorical(_range_paths(ranges), index)


def _as_categorical(values: np.ndarray, index: np.ndarray) -> pd.Categorical:
    """values[index] ("" where index is -1) as a categorical, without building 1e7 strings."""
    codes, uniques = pd.factorize(np.append(values, ""))
    blank = codes[-1]
    return pd.Categorical.from_codes(np.where(index >= 0, codes[np.maximum(index, 0)], blank),
                                     categories=pd.Index(uniques, dtype=object))


def _thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return pid.astype("int64") << 24 | (tid.astype("int64") & 0xFFFFFF)


def _innermost(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Row of the innermost range containing each point on the given thread, -1 if none."""
    n = len(ts)
    result = np.full(n, -1, "int64")
    if n == 0 or ranges.empty:
        return result
    start = ranges["start_ns"].to_numpy()
    end = ranges["end_ns"].to_numpy()
    range_threads, range_rank = np.unique(_thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy()),
                                          return_inverse=True)
    point_keys = _thread_key(pid, tid)
    point_rank = np.clip(np.searchsorted(range_threads, point_keys), 0, len(range_threads) - 1)
    on_thread = range_threads[point_rank] == point_keys
    # One sorted axis for all threads: thread rank * span + time. A single searchsorted then
    # finds, for every point, the last range of its thread that started at or before it.
    origin = min(int(start.min()), int(ts.min()))
    span = max(int(start.max()), int(ts.max())) - origin + 1
    if span * len(range_threads) >= 2**62:  # absurd time spans (damaged exports): give up cleanly
        return result
    range_axis = range_rank.astype("int64") * span + (start - origin)
    order = np.argsort(range_axis, kind="stable")
    point_axis = point_rank.astype("int64") * span + (ts - origin)
    pos = np.searchsorted(range_axis[order], point_axis, side="right") - 1
    candidate = np.where(pos >= 0, order[np.maximum(pos, 0)], -1)
    candidate = np.where(on_thread & (candidate >= 0) & (range_rank[np.maximum(candidate, 0)] == point_rank),
                         candidate, -1)
    # Ranges on one thread nest, so the innermost one open at t is the latest-starting range
    # still open at t: walk from that candidate outwards, one nesting level per round.
    parent = ranges["parent"].to_numpy()
    live = np.flatnonzero(candidate >= 0)
    for _ in range(MAX_NVTX_DEPTH):
        if len(live) == 0:
            break
        inside = end[candidate[live]] > ts[live]
        result[live[inside]] = candidate[live[inside]]
        live = live[~inside]
        candidate[live] = parent[candidate[live]]
        live = live[candidate[live] >= 0]
    return result


def _parents(ranges: pd.DataFrame, order: np.ndarray, keys: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """For each range, the range that encloses it on its thread (-1 for outermost ones).

    `order` lists the ranges per thread in start order. A range's parent is the latest earlier
    range of its thread one level up: one sort by (thread, depth, position) and one binary
    search find them all at once, whatever the depth (a program that pushes without popping
    nests 100,000 deep; a loop per level would take minutes there).
    """
    n = len(ranges)
    parent = np.full(n, -1, "int64")
    if n == 0:
        return parent
    position = np.empty(n, "int64")
    position[order] = np.arange(n)
    levels = np.lexsort((position, depth, keys))
    table = np.empty(n, dtype=[("key", "int64"), ("depth", "int64"), ("position", "int64")])
    table["key"], table["depth"], table["position"] = keys[levels], depth[levels], position[levels]
    probe = np.empty(n, dtype=table.dtype)
    probe["key"], probe["depth"], probe["position"] = keys, depth - 1, position
    at = np.searchsorted(table, probe, side="left") - 1  # the last one up with a smaller position
    candidate = levels[np.maximum(at, 0)]
    found = (at >= 0) & (depth > 1) & (keys[candidate] == keys) & (depth[candidate] == depth - 1)
    parent[found] = candidate[found]
    return parent


def _range_paths(ranges: pd.DataFrame) -> np.ndarray:
    parent = ranges["parent"].to_numpy()
    names = ranges["name"].to_numpy(dtype=object)
    paths = names.copy()
    depth = ranges["depth"].to_numpy()
    # Build paths outermost first, one nesting level at a time.
    for level in range(2, min(int(depth.max()), MAX_NVTX_DEPTH) + 1):
        here = np.flatnonzero((depth == level) & (parent >= 0))
        paths[here] = paths[parent[here]] + " > " + names[here]
    return paths


# --- call sites ----------------------------------------------------------------------------

# Frames that are not "the caller": CUDA runtime/driver, the profiler's injection, and the
# allocator layers between user code and cudaMalloc (PyTorch's caching allocator, ATen, the
# dispatcher, CPython's interpreter, libc start-up).
_NOT_CALLER_MODULES = re.compile(
    r"libcupti|libcuda\.so|libcudart|libToolsInjection|libnvToolsExt|libnvtx|libcublas|libcudnn|"
    r"libnccl|libc10|libtorch|libpython|ld-linux|/libc\.so|libstdc\+\+", re.I)
_NOT_CALLER_SYMBOLS = re.compile(
    r"^(cu[A-Z]\w*|cuda[A-Z]\w*|cudaError(_t)? cuda\w*|c10::|at::|torch::|caffe2::|_Py|Py[A-Z]|"
    r"__libc_start|_start$|__cuda|cudart::|std::|0x[0-9a-f]+$)")
_ALLOCATOR_SYMBOLS = re.compile(r"^(c10::|at::|torch::|caffe2::|cudaError(_t)? cuda\w*)")


def _call_sites(conn: sqlite3.Connection, schema: Schema, events: pd.DataFrame, chains: pd.DataFrame,
                thread_names: dict[tuple[int, int], str],
                diagnostics: list[Diagnostic]) -> tuple[pd.DataFrame, pd.Categorical]:
    """A site label per event, and the table of sites (label -> function, symbol, module)."""
    n = len(events)
    if n == 0:
        return _empty_sites(), pd.Categorical([], categories=[""])
    # Work on integer keys: one label per distinct key, never one string per event.
    key = np.full(n, -1, "int64")
    label_keys: dict[str, int] = {"": 0}  # label -> key; key 0 is "no site"

    def key_of(label: str) -> int:
        return label_keys.setdefault(label, len(label_keys))

    rows = []
    is_alloc = (events["op"] == "alloc").to_numpy()

    stack_sites = _stack_sites(conn, schema, events, diagnostics)  # callchain id -> site dict
    if stack_sites:
        chain_ids = np.array(sorted(stack_sites), dtype="int64")
        chain_key = np.array([key_of(stack_sites[c]["label"]) for c in chain_ids], dtype="int64")
        rows.extend(stack_sites.values())
        event_chain = events["callchain_id"].to_numpy()
        at = np.clip(np.searchsorted(chain_ids, event_chain), 0, len(chain_ids) - 1)
        has = is_alloc & (chain_ids[at] == event_chain)
        key[has] = chain_key[at[has]]

    # Without a stack: API name + innermost NVTX range + thread name.
    need = np.flatnonzero(is_alloc & (key < 0))
    if len(need):
        parts = pd.DataFrame({"api": events["api"].cat.codes.to_numpy()[need],
                              "nvtx": events["nvtx_range"].cat.codes.to_numpy()[need],
                              "pid": events["pid"].to_numpy()[need], "tid": events["tid"].to_numpy()[need]})
        group = parts.groupby(["api", "nvtx", "pid", "tid"], sort=False).ngroup().to_numpy()
        firsts = parts.groupby(group, sort=False).head(1)  # one row per distinct key
        api_names = events["api"].cat.categories
        nvtx_names = events["nvtx_range"].cat.categories
        group_key = np.empty(len(firsts), "int64")
        for i, (api, nvtx, pid, tid) in enumerate(firsts.itertuples(index=False)):  # per distinct key
            thread = thread_names.get((int(pid), int(tid)), "") if tid >= 0 else ""
            label = _fallback_label(str(api_names[api]) if api >= 0 else "?",
                                    str(nvtx_names[nvtx]) if nvtx >= 0 else "", thread)
            group_key[group[firsts.index[i]]] = key_of(label)
            rows.append({"label": label, "function": "", "symbol": "", "module": "", "from_stack": False})
        key[need] = group_key[group]

    # A free belongs to the site of the allocation it frees.
    partner = events["partner"].to_numpy()
    frees = np.flatnonzero(~is_alloc & (partner >= 0))
    key[frees] = key[partner[frees]]
    sites = pd.DataFrame(rows, columns=SITE_COLUMNS).drop_duplicates("label", ignore_index=True)
    return sites, pd.Categorical.from_codes(np.maximum(key, 0), categories=pd.Index(list(label_keys), dtype=object))


def _fallback_label(api: str, nvtx: str, thread: str) -> str:
    label = api
    if nvtx:
        label += f" in {nvtx}"
    if thread:
        label += f" [{thread}]"
    return label


def _stack_sites(conn: sqlite3.Connection, schema: Schema, events: pd.DataFrame,
                 diagnostics: list[Diagnostic]) -> dict[int, dict]:
    """Callchain id -> site of the allocation calls that have a stack."""
    if not (schema.has_backtraces and "callchain_id" in events
            and schema.has("CUDA_CALLCHAINS", "id", "symbol", "module", "stackDepth")):
        return {}
    chain_ids = events["callchain_id"].to_numpy()
    wanted = np.unique(chain_ids[(events["op"] == "alloc").to_numpy() & (chain_ids >= 0)])
    if len(wanted) == 0:
        return {}
    unresolved = "c." + _quote("unresolved") if schema.has("CUDA_CALLCHAINS", "unresolved") else "0"
    frames = read_frame(conn, (
        "SELECT c.id, c.stackDepth, CAST(substr(coalesce(sym.value, ''), 1, 300) AS TEXT), "
        "CAST(substr(coalesce(mdl.value, ''), 1, 300) AS TEXT), "
        f"{unresolved} FROM CUDA_CALLCHAINS AS c "
        "LEFT JOIN StringIds AS sym ON sym.id = c.symbol LEFT JOIN StringIds AS mdl ON mdl.id = c.module "
        f"WHERE c.id IN ({','.join(str(int(i)) for i in wanted)}) ORDER BY c.id, c.stackDepth"),
        ["id", "depth", "symbol", "module", "unresolved"])
    if frames.empty:
        return {}
    frames["symbol"] = frames["symbol"].fillna("").astype(str)
    frames["module"] = frames["module"].fillna("").astype(str)
    unresolved_frame = pd.to_numeric(frames["unresolved"], errors="coerce").fillna(0).to_numpy() != 0
    cuda_layer = frames["module"].str.contains(_NOT_CALLER_MODULES).to_numpy() \
        | frames["symbol"].str.match(_NOT_CALLER_SYMBOLS).to_numpy() | unresolved_frame
    allocator_layer = frames["symbol"].str.match(_ALLOCATOR_SYMBOLS).to_numpy()
    frames["is_caller"] = ~cuda_layer
    frames["is_fallback"] = ~unresolved_frame & ~frames["symbol"].str.match(r"^(cu[A-Z]|cuda[A-Z]|0x)").to_numpy() \
        & ~allocator_layer
    # First frame from the innermost outwards that is user code; if a stack is all library and
    # interpreter code (PyTorch without Python backtraces), the first frame above the allocator.
    firsts = frames[frames["is_caller"]].groupby("id", sort=False).head(1)
    fallbacks = frames[frames["is_fallback"]].groupby("id", sort=False).head(1)
    chosen = pd.concat([firsts, fallbacks[~fallbacks["id"].isin(firsts["id"])]])
    sites = {}
    for chain_id, symbol, module in chosen[["id", "symbol", "module"]].itertuples(index=False):  # per stack
        function = short_function(symbol)
        module_name = PurePosixPath(module).name if module else ""
        label = f"{function} ({module_name})" if module_name else function
        sites[int(chain_id)] = {"label": label, "function": function, "symbol": symbol,
                                "module": module_name, "from_stack": True}
    return sites


def short_function(symbol: str) -> str:
    """`alloc_weights(unsigned long)` -> `alloc_weights`; `ns::f<int>(x) const` -> `ns::f<int>`."""
    depth, cut = 0, len(symbol)
    for i, ch in enumerate(symbol):
        if ch in "<[":
            depth += 1
        elif ch in ">]":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    name = symbol[:cut].strip()
    # Drop a leading return type ("cudaError cudaMalloc<char>") at template depth 0.
    depth, last_space = 0, -1
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == " " and depth == 0:
            last_space = i
    return name[last_space + 1:] if last_space >= 0 else name
