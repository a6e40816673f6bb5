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

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Callable, Optional

import numpy as np
import pandas as pd

from . import apis
from .errors import NsysanError
from .model import Diagnostic
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
    "family": "category", "return_value": "int64", "correlation_id": "int64",
}

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
    ranges: pd.DataFrame  # NVTX push/pop ranges: pid, tid, start_ns, end_ns, name, depth
    sites: pd.DataFrame  # label -> function, symbol, module, from_stack
    thread_names: dict[tuple[int, int], str]
    diagnostics: list[Diagnostic] = field(default_factory=list)


def load_events(conn: sqlite3.Connection, schema: Schema, progress: Optional[Progress] = None) -> LoadedEvents:
    """Read and normalize the export's memory events, API calls and NVTX ranges."""
    try:
        return _load(conn, schema, progress or (lambda stage, fraction: None))
    except sqlite3.DatabaseError as err:
        raise NsysanError(f"the export could not be read ({err}); it may be truncated or damaged") from err


def _load(conn: sqlite3.Connection, schema: Schema, progress: Progress) -> LoadedEvents:
    diagnostics: list[Diagnostic] = []
    thread_names = _read_thread_names(conn, schema)
    progress("reading API calls", 0.0)
    calls, chains = _read_calls(conn, schema, diagnostics)
    progress("reading memory events", 0.25)
    raw = _read_memory_events(conn, schema, diagnostics)
    progress("reading NVTX ranges", 0.6)
    ranges = _read_nvtx_ranges(conn, schema)
    progress("matching allocations and frees", 0.75)
    events = _normalize(raw, calls, chains, schema, diagnostics)
    events["nvtx_range"], events["nvtx_path"] = attribute_ranges(events, ranges)
    sites, labels = _call_sites(conn, schema, events, chains, thread_names, diagnostics)
    events["site"] = labels
    events = events[list(EVENT_COLUMNS)]
    progress("done", 1.0)
    return LoadedEvents(events=events, calls=calls, ranges=ranges, sites=sites,
                        thread_names=thread_names, diagnostics=diagnostics)


# --- reading -------------------------------------------------------------------------------

def read_frame(conn: sqlite3.Connection, sql: str, columns: list[str],
               params: tuple = ()) -> pd.DataFrame:
    """Run a query and return its rows as a DataFrame with the given column names."""
    cursor = conn.execute(sql, params)
    rows = cursor.fetchall()
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    return pd.DataFrame.from_records(rows, columns=columns)


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
    return _ints(frame, column).fillna(fill).to_numpy(dtype=dtype)


def _col(schema: Schema, table: str, column: str, default: str = "NULL") -> str:
    return _quote(column) if schema.has(table, column) else default


def _read_thread_names(conn: sqlite3.Connection, schema: Schema) -> dict[tuple[int, int], str]:
    if not (schema.has("ThreadNames", "nameId", "globalTid") and schema.has("StringIds", "id", "value")):
        return {}
    sql = ("SELECT t.globalTid, substr(s.value, 1, 100) FROM ThreadNames AS t "
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
        if name in apis.FAMILIES:
            ids[int(string_id)] = name
    return ids


def _read_calls(conn: sqlite3.Connection, schema: Schema,
                diagnostics: list[Diagnostic]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Memory API calls, and the call stack id of each (pid, correlationId) that has one."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    empty_chains = pd.DataFrame({"pid": np.zeros(0, "int32"), "correlation_id": np.zeros(0, "int64"),
                                 "callchain_id": np.zeros(0, "int64")})
    if not schema.has(table, "start", "nameId", "globalTid", "correlationId"):
        return _empty_calls(), empty_chains
    name_ids = _memory_api_ids(conn, schema)
    if not name_ids:
        return _empty_calls(), empty_chains
    id_list = ",".join(str(i) for i in sorted(name_ids))
    sql = (f"SELECT start, {_col(schema, table, 'end', 'start')}, globalTid, correlationId, nameId, "
           f"{_col(schema, table, 'returnValue', '0')}, {_col(schema, table, 'eventClass', '0')}, "
           f"{_col(schema, table, 'callchainId')} FROM {table} WHERE nameId IN ({id_list})")
    raw = read_frame(conn, sql, ["start", "end", "global_tid", "correlation_id", "name_id",
                                 "return_value", "event_class", "callchain_id"])
    global_tid = _int_column(raw, "global_tid")
    pid = ((global_tid >> 24) & 0xFFFFFF).astype("int32")
    correlation = _int_column(raw, "correlation_id")
    event_class = _int_column(raw, "event_class")
    chain = pd.to_numeric(raw["callchain_id"], errors="coerce")
    has_chain = chain.notna().to_numpy()
    chains = pd.DataFrame({"pid": pid[has_chain], "correlation_id": correlation[has_chain],
                           "callchain_id": chain[has_chain].astype("int64").to_numpy()})
    # One stack per call: with --cudabacktrace, 2025.x writes a twin row (eventClass 67) that
    # carries it; older exports put it on the call's own row.
    chains = chains.groupby(["pid", "correlation_id"], as_index=False)["callchain_id"].max()

    real = event_class != 67  # the twins duplicate calls: never count or time them
    names = pd.Series(_int_column(raw, "name_id")[real]).map(name_ids)
    start = _int_column(raw, "start")[real] - schema.time_offset_ns
    end = _int_column(raw, "end")[real] - schema.time_offset_ns
    calls = pd.DataFrame({
        "ts_ns": start, "end_ns": np.maximum(end, start), "pid": pid[real],
        "tid": (global_tid[real] & 0xFFFFFF).astype("int32"),
        "api": pd.Categorical(names), "family": pd.Categorical(names.map(apis.FAMILIES)),
        "return_value": _int_column(raw, "return_value")[real], "correlation_id": correlation[real],
    })
    calls = calls.sort_values("ts_ns", kind="stable", ignore_index=True)
    return calls, chains


def _empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in CALL_COLUMNS.items()})


def _read_memory_events(conn: sqlite3.Connection, schema: Schema,
                        diagnostics: list[Diagnostic]) -> pd.DataFrame:
    table = "CUDA_GPU_MEMORY_USAGE_EVENTS"
    columns = ["row", "start", "global_pid", "device", "address", "bytes", "mem_kind", "op_type",
               "correlation_id", "pool_address"]
    if not schema.memory_usage_collected:
        return pd.DataFrame({c: pd.Series(dtype="int64") for c in columns})
    sql = (f"SELECT rowid, start, globalPid, {_col(schema, table, 'deviceId', '0')}, address, bytes, "
           f"{_col(schema, table, 'memKind', '2')}, {_col(schema, table, 'memoryOperationType', '0')}, "
           f"{_col(schema, table, 'correlationId', '0')}, {_col(schema, table, 'localMemoryPoolAddress')} "
           f"FROM {table}")
    return read_frame(conn, sql, columns)


def _read_nvtx_ranges(conn: sqlite3.Connection, schema: Schema) -> pd.DataFrame:
    """Push/pop NVTX ranges with their nesting depth (1 = outermost on that thread)."""
    table = "NVTX_EVENTS"
    empty = pd.DataFrame({"pid": pd.Series(dtype="int32"), "tid": pd.Series(dtype="int32"),
                          "start_ns": pd.Series(dtype="int64"), "end_ns": pd.Series(dtype="int64"),
                          "name": pd.Series(dtype="object"), "depth": pd.Series(dtype="int16")})
    if not schema.has(table, "start", "eventType", "globalTid"):
        return empty
    text = _col(schema, table, "text", "NULL")
    if schema.has(table, "textId") and schema.has("StringIds", "id", "value"):
        # A message registered with nvtxDomainRegisterString is in textId, otherwise in text.
        name_sql = f"substr(coalesce(n.{text}, s.value, ''), 1, {NVTX_NAME_CHARS})"
        join = "LEFT JOIN StringIds AS s ON s.id = n.textId"
    else:
        name_sql = f"substr(coalesce(n.{text}, ''), 1, {NVTX_NAME_CHARS})"
        join = ""
    end = "n." + _col(schema, table, "end", "NULL")
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


# --- normalizing ---------------------------------------------------------------------------

def _normalize(raw: pd.DataFrame, calls: pd.DataFrame, chains: pd.DataFrame, schema: Schema,
               diagnostics: list[Diagnostic]) -> pd.DataFrame:
    if raw.empty:
        return _empty_events()
    frame = pd.DataFrame({
        "row": _int_column(raw, "row"),
        "ts_ns": _int_column(raw, "start", fill=-1) - schema.time_offset_ns,
        "pid": ((_int_column(raw, "global_pid") >> 24) & 0xFFFFFF).astype("int32"),
        "device": np.clip(_int_column(raw, "device"), -1, 32767).astype("int16"),
        "address": _int_column(raw, "address"),
        "bytes": _int_column(raw, "bytes", fill=-1),
        "kind_id": _int_column(raw, "mem_kind", fill=7),
        "op_id": _int_column(raw, "op_type", fill=-1),
        "correlation_id": _int_column(raw, "correlation_id"),
        "pool": pd.to_numeric(raw["pool_address"], errors="coerce").notna().to_numpy(),
    })
    bad_values = np.zeros(len(raw), bool)
    for column in ("start", "global_pid", "address", "bytes"):
        bad_values |= _ints(raw, column).isna().to_numpy()
    op = frame["op_id"].map(schema.mem_ops)
    # Sizes beyond 1 PiB or below zero are not real allocations (damaged or hostile exports);
    # they would also overflow the running sums.
    bad = bad_values | op.isna().to_numpy() | (frame["bytes"].to_numpy() < 0) \
        | (frame["bytes"].to_numpy() > 2**50)
    if bad.any():
        diagnostics.append(Diagnostic(
            "warning", "bad_memory_rows",
            f"{int(bad.sum())} memory events had missing or impossible values (unknown operation, "
            "size below 0 or above 1 PiB, NULL time or address) and were left out"))
        frame, op = frame[~bad], op[~bad]
    frame["op"] = op.to_numpy()
    frame["kind"] = frame["kind_id"].map(schema.mem_kinds).fillna("unknown").to_numpy()

    # Thread and API name come from the API call that caused the event.
    real_calls = calls[["pid", "correlation_id", "tid", "api"]]
    real_calls = real_calls[real_calls["correlation_id"] != 0]
    real_calls = real_calls.drop_duplicates(["pid", "correlation_id"])
    frame = frame.merge(real_calls, on=["pid", "correlation_id"], how="left", sort=False)
    frame = frame.merge(chains, on=["pid", "correlation_id"], how="left", sort=False)
    frame["tid"] = frame["tid"].fillna(-1).astype("int32")
    api = frame["api"].astype(object)
    no_api = api.isna()
    api[no_api & (frame["kind"] == "static")] = "(module load)"
    api[api.isna()] = "(no API call)"
    frame["api"] = api.to_numpy()

    # Canonical order: time, then frees before allocs (a peak is never overstated by a free and
    # an alloc recorded at the same ns), then the export's row order. nsys 2025.6 no longer
    # writes rows in time order, so never rely on it alone.
    frame["is_alloc"] = frame["op"] == "alloc"
    frame = frame.sort_values(["ts_ns", "is_alloc", "row"], kind="stable", ignore_index=True)
    frame["partner"] = _pair_allocs_and_frees(frame)
    alloc_bytes = frame["bytes"].to_numpy()
    partner = frame["partner"].to_numpy()
    is_alloc = frame["is_alloc"].to_numpy()
    # A free takes the size of its allocation (older exports leave bytes 0 on free rows); a free
    # with no allocation in the capture changes nothing we counted.
    freed_size = np.where(partner >= 0, alloc_bytes[np.maximum(partner, 0)], alloc_bytes)
    frame["bytes"] = np.where(is_alloc, alloc_bytes, freed_size)
    frame["delta_bytes"] = np.where(is_alloc, alloc_bytes, np.where(partner >= 0, -freed_size, 0))
    for column in ("kind", "op", "api"):
        frame[column] = frame[column].astype("category")
    frame["address"] = frame["address"].astype("uint64")
    return frame


def _empty_events() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype=t) for c, t in EVENT_COLUMNS.items()})
    frame["callchain_id"] = pd.Series(dtype="float64")
    return frame


def _pair_allocs_and_frees(frame: pd.DataFrame) -> np.ndarray:
    """For each event, the row of its partner: an alloc's free, a free's alloc (-1 if none).

    Addresses are reused, so pairing is by order per (process, address): a free closes the
    allocation immediately before it at that address. A free after a free, or first at its
    address, has no allocation in the capture (allocated before it started).
    """
    n = len(frame)
    partner = np.full(n, -1, "int64")
    if n == 0:
        return partner
    # Per address, keep the export's order among events at the same ns (a free sorted before
    # its own alloc at an equal timestamp would otherwise look unmatched).
    order = np.lexsort((frame["row"].to_numpy(), frame["ts_ns"].to_numpy(),
                        frame["address"].to_numpy(), frame["pid"].to_numpy()))
    pid = frame["pid"].to_numpy()[order]
    address = frame["address"].to_numpy()[order]
    is_alloc = frame["is_alloc"].to_numpy()[order]
    same_block = np.zeros(n, bool)
    same_block[1:] = (pid[1:] == pid[:-1]) & (address[1:] == address[:-1])
    # event i (a free) pairs with event i-1 (an alloc) at the same address
    pairs = np.flatnonzero(same_block & ~is_alloc & np.roll(is_alloc, 1))
    partner[order[pairs]] = order[pairs - 1]
    partner[order[pairs - 1]] = order[pairs]
    return partner


# --- NVTX attribution ----------------------------------------------------------------------

def attribute_ranges(points: pd.DataFrame, ranges: pd.DataFrame) -> tuple[pd.Categorical, pd.Categorical]:
    """Innermost NVTX range and range path open at each point (columns pid, tid, ts_ns).

    Looks on the point's own thread first, then on the process's main thread (tid == pid):
    PyTorch runs backward passes on autograd threads that have no ranges of their own.
    """
    n = len(points)
    if n == 0 or ranges.empty:
        empty = pd.Categorical([""] * n, categories=[""])
        return empty, empty
    paths = _range_paths(ranges)
    own = _innermost(points["pid"].to_numpy(), points["tid"].to_numpy(), points["ts_ns"].to_numpy(), ranges)
    main = _innermost(points["pid"].to_numpy(), points["pid"].to_numpy(), points["ts_ns"].to_numpy(), ranges)
    index = np.where(own >= 0, own, main)
    names = np.append(ranges["name"].to_numpy(dtype=object), "")
    path_values = np.append(paths, "")
    return (pd.Categorical(names[index]), pd.Categorical(path_values[index]))


def _thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    return pid.astype("int64") << 24 | (tid.astype("int64") & 0xFFFFFF)


def _innermost(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Row of the innermost range containing each point on the given thread, -1 if none."""
    n = len(ts)
    if n == 0:
        return np.zeros(0, "int64")
    keys = _thread_key(pid, tid)
    range_keys = _thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy())
    start = ranges["start_ns"].to_numpy()
    end = ranges["end_ns"].to_numpy()
    depth = ranges["depth"].to_numpy().astype("int64")
    # Ranges on one thread nest, so the innermost one open at t is the latest-starting range
    # among those open at t. Walk candidates from the latest start before t outwards, level by
    # level (vectorized over points; the loop runs at most the nesting depth).
    order = np.lexsort((start, range_keys))
    sorted_keys, sorted_start = range_keys[order], start[order]
    # position of the last range on the same thread with start <= t
    combined = np.empty(len(order), dtype=[("k", "int64"), ("s", "int64")])
    combined["k"], combined["s"] = sorted_keys, sorted_start
    probe = np.empty(n, dtype=combined.dtype)
    probe["k"], probe["s"] = keys, ts
    pos = np.searchsorted(combined, probe, side="right") - 1
    result = np.full(n, -1, "int64")
    valid = pos >= 0
    valid[valid] = sorted_keys[pos[valid]] == keys[valid]
    candidate = np.where(valid, order[np.maximum(pos, 0)], -1)
    parent = _parents(ranges, order, range_keys, depth)
    for _ in range(MAX_NVTX_DEPTH):
        live = candidate >= 0
        if not live.any():
            break
        contains = np.zeros(n, bool)
        contains[live] = end[candidate[live]] > ts[live]
        hit = live & contains
        result[hit] = candidate[hit]
        step = live & ~contains
        candidate = np.where(step, parent[np.maximum(candidate, 0)], -1)
    return result


def _parents(ranges: pd.DataFrame, order: np.ndarray, keys: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """For each range, the range that encloses it on its thread (-1 for outermost ones)."""
    n = len(ranges)
    parent = np.full(n, -1, "int64")
    # Within a thread in start order, a range's parent is the latest earlier range one level up.
    frame = pd.DataFrame({"key": keys[order], "depth": depth[order], "row": order, "pos": np.arange(n)})
    # Vectorized "last seen row at depth d-1" per thread: forward-fill per (key, depth) level.
    for level in np.unique(frame["depth"].to_numpy()):
        if level <= 1:
            continue
        upper = frame["depth"].to_numpy() == level - 1
        marker = pd.Series(np.where(upper, frame["row"].to_numpy(), -1), dtype="int64")
        marker = marker.where(upper).groupby(frame["key"].to_numpy()).ffill().fillna(-1).astype("int64")
        here = frame["depth"].to_numpy() == level
        parent[frame["row"].to_numpy()[here]] = marker.to_numpy()[here]
    return parent


def _range_paths(ranges: pd.DataFrame) -> np.ndarray:
    keys = _thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy())
    order = np.lexsort((ranges["start_ns"].to_numpy(), keys))
    parent = _parents(ranges, order, keys, ranges["depth"].to_numpy().astype("int64"))
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
    site_columns = {"label": [], "function": [], "symbol": [], "module": [], "from_stack": []}
    labels = np.full(n, "", dtype=object)
    if n == 0:
        return pd.DataFrame(site_columns), pd.Categorical(labels)

    stack_sites = _stack_sites(conn, schema, events, diagnostics)  # callchain id -> site dict
    chain_ids = events["callchain_id"].to_numpy() if "callchain_id" in events else np.full(n, np.nan)
    is_alloc = (events["op"] == "alloc").to_numpy()
    rows = []
    if stack_sites:
        chain_labels = {cid: s["label"] for cid, s in stack_sites.items()}
        mapped = pd.Series(chain_ids).map(chain_labels).to_numpy(dtype=object)
        has = pd.notna(mapped)
        labels[has] = mapped[has]
        rows.extend(stack_sites.values())

    # Without a stack: API name + innermost NVTX range + thread name.
    need = np.flatnonzero(is_alloc & (labels == ""))
    if len(need):
        keys = pd.DataFrame({"api": events["api"].to_numpy()[need].astype(str),
                             "nvtx": events["nvtx_range"].to_numpy()[need].astype(str),
                             "pid": events["pid"].to_numpy()[need], "tid": events["tid"].to_numpy()[need]})
        unique = keys.drop_duplicates()
        unique_labels = [
            _fallback_label(api, nvtx, thread_names.get((pid, tid), "") if tid >= 0 else "")
            for api, nvtx, pid, tid in unique.itertuples(index=False)   # one per distinct key, not per event
        ]
        unique = unique.assign(label=unique_labels)
        labels[need] = keys.merge(unique, on=["api", "nvtx", "pid", "tid"], how="left")["label"].to_numpy()
        for label in dict.fromkeys(unique_labels):
            rows.append({"label": label, "function": "", "symbol": "", "module": "", "from_stack": False})

    # A free belongs to the site of the allocation it frees.
    partner = events["partner"].to_numpy()
    frees = np.flatnonzero(~is_alloc & (partner >= 0))
    labels[frees] = labels[partner[frees]]
    sites = pd.DataFrame(rows, columns=list(site_columns)).drop_duplicates("label", ignore_index=True)
    return sites, pd.Categorical(labels)


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
    wanted = events.loc[(events["op"] == "alloc") & events["callchain_id"].notna(), "callchain_id"]
    wanted = np.unique(wanted.to_numpy().astype("int64"))
    if len(wanted) == 0:
        return {}
    unresolved = _col(schema, "CUDA_CALLCHAINS", "unresolved", "0")
    frames = read_frame(conn, (
        "SELECT c.id, c.stackDepth, substr(sym.value, 1, 300), substr(mdl.value, 1, 300), "
        f"c.{unresolved} FROM CUDA_CALLCHAINS AS c "
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
