"""The few CUDA API calls that change GPU memory without a memory event: context creation, code
(module and library) loads, stream capture and CUDA graphs (analyses/hidden.py, analyses/graphs.py).

One query on the API table, filtered by the StringIds ids of just these names: when the export
holds none of them (most large exports never load a library after start-up nor capture a graph,
and no export before CUDA 10 has graph calls), the API table is not scanned at all.
"""

from __future__ import annotations

import sqlite3
from typing import Optional
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..base import apis
from ..sources.reader import read_table
from ..sources.schema import Schema
from .columns import ints

# Context creation: cuInit and the calls that create a context (the runtime creates its primary
# context inside the first call that needs it, which nsys does not show apart).
CONTEXT_APIS = frozenset({"cuInit", "cuCtxCreate", "cuDevicePrimaryCtxRetain"})
LOAD_APIS = frozenset({"cuModuleLoad", "cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
                       "cuLibraryLoadData", "cuLibraryLoadFromFile"})
UNLOAD_APIS = frozenset({"cuModuleUnload", "cuLibraryUnload"})
CAPTURE_BEGIN_APIS = frozenset({"cudaStreamBeginCapture", "cudaStreamBeginCaptureToGraph", "cuStreamBeginCapture",
                                "cuStreamBeginCaptureToGraph"})
CAPTURE_END_APIS = frozenset({"cudaStreamEndCapture", "cuStreamEndCapture"})
INSTANTIATE_APIS = frozenset({"cudaGraphInstantiate", "cudaGraphInstantiateWithFlags",
                              "cudaGraphInstantiateWithParams", "cuGraphInstantiate", "cuGraphInstantiateWithFlags",
                              "cuGraphInstantiateWithParams"})
EXEC_DESTROY_APIS = frozenset({"cudaGraphExecDestroy", "cuGraphExecDestroy"})
GRAPH_DESTROY_APIS = frozenset({"cudaGraphDestroy", "cuGraphDestroy"})
LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
MEM_NODE_APIS = frozenset({"cudaGraphAddMemAllocNode", "cuGraphAddMemAllocNode"})
# What each name counts as (the `what` column).
WHAT = {**{a: "context" for a in CONTEXT_APIS}, **{a: "load" for a in LOAD_APIS},
        **{a: "unload" for a in UNLOAD_APIS}, **{a: "capture_begin" for a in CAPTURE_BEGIN_APIS},
        **{a: "capture_end" for a in CAPTURE_END_APIS}, **{a: "instantiate" for a in INSTANTIATE_APIS},
        **{a: "exec_destroy" for a in EXEC_DESTROY_APIS}, **{a: "graph_destroy" for a in GRAPH_DESTROY_APIS},
        **{a: "launch" for a in LAUNCH_APIS}, **{a: "mem_node" for a in MEM_NODE_APIS}}
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
# A load is named by the first kernel of its process that started within this long after it.
KERNEL_AFTER_LOAD_NS = 1_000_000_000
# Windows of seconds after loads read in one query (two bound parameters each; SQLite allows 999 before 3.32).
MAX_WINDOWS = 400


@dataclass
class CodeTrace:
    """The calls named in WHAT (`calls`, see read_code_calls) and the CUDA devices each process
    has a context on (`contexts`: pid -> devices, from TARGET_INFO_CUDA_CONTEXT_INFO; {} when the
    export lacks it, as before nsys 2023)."""

    calls: pd.DataFrame
    contexts: dict[int, list[int]] = field(default_factory=dict)


def read_code_trace(conn: sqlite3.Connection, schema: Schema, calls: Optional[pd.DataFrame] = None) -> CodeTrace:
    """`calls`: read_code_calls' frame, when already made (events/load.py)."""
    return CodeTrace(read_code_calls(conn, schema) if calls is None else calls, read_contexts(conn, schema))


def with_kernels_after_loads(conn: sqlite3.Connection, schema: Schema, trace: CodeTrace, pids: list[int]) -> CodeTrace:
    """`trace` with a `kernel` column: for each load call of `pids`, the short name of the first
    kernel of its process that started after the call ended (within KERNEL_AFTER_LOAD_NS); "" for
    other calls, for loads with none, and without the kernel table.

    A load from memory (cuLibraryLoadData, cuModuleLoadData) names no file, and nsys puts no call
    stack on it: the code it brought is what runs next (with lazy loading, a library's kernels
    load just before their first launch). Read only for the processes that keep loading code
    (pipeline/stages.py), in one scan of the kernel table that returns only the kernels of the seconds
    after their loads."""
    calls = trace.calls
    names = np.full(len(calls), "", dtype=object)
    is_load = ((calls["what"] == "load") & calls["pid"].isin(pids)).to_numpy()
    if is_load.any() and schema.has(KERNEL_TABLE, "start", "globalPid", "shortName") \
            and schema.has("StringIds", "id", "value"):
        _name_loads(conn, schema, calls, is_load, names)
    return CodeTrace(calls.assign(kernel=names), trace.contexts)


def _name_loads(conn: sqlite3.Connection, schema: Schema, calls: pd.DataFrame, is_load: np.ndarray,
                names: np.ndarray) -> None:
    load_rows = np.flatnonzero(is_load)
    load_pid = calls["pid"].to_numpy("int64")[load_rows]
    load_end = calls["end_ns"].to_numpy("int64")[load_rows]
    # the seconds after the loads, overlapping ones merged: the kernels in them are few
    windows: list[list[int]] = []
    for end in np.sort(load_end) + schema.time_offset_ns:
        if windows and end <= windows[-1][1]:
            windows[-1][1] = int(end) + KERNEL_AFTER_LOAD_NS
        else:
            windows.append([int(end), int(end) + KERNEL_AFTER_LOAD_NS])
    if len(windows) > MAX_WINDOWS:  # past SQLite's bound parameters: one window over them all
        windows = [[windows[0][0], windows[-1][1]]]
    where = " OR ".join("(start > ? AND start <= ?)" for _ in windows)
    rows = conn.execute(f"SELECT start, globalPid, shortName FROM {KERNEL_TABLE} WHERE ({where}) "
                        "AND typeof(start) = 'integer' AND typeof(globalPid) = 'integer' "
                        "AND typeof(shortName) = 'integer'", [v for w in windows for v in w]).fetchall()
    if not rows:
        return
    found = np.array(rows, dtype="int64").reshape(-1, 3)
    kernel_ts = found[:, 0] - schema.time_offset_ns
    kernel_pid = (found[:, 1] >> 24) & 0xFFFFFF
    order = np.lexsort((kernel_ts, kernel_pid))
    kernel_ts, kernel_pid, kernel_name = kernel_ts[order], kernel_pid[order], found[order, 2]
    chosen: dict[int, int] = {}  # row of the load -> the kernel's name id
    for pid in np.unique(load_pid):
        lo, hi = np.searchsorted(kernel_pid, [pid, pid + 1])
        ts = kernel_ts[lo:hi]
        mine = load_pid == pid
        at = np.searchsorted(ts, load_end[mine], side="right")
        for row, i, end in zip(load_rows[mine], at, load_end[mine]):
            if i < len(ts) and ts[i] - end <= KERNEL_AFTER_LOAD_NS:
                chosen[int(row)] = int(kernel_name[lo + i])
    ids = sorted(set(chosen.values()))
    text = dict(conn.execute(f"SELECT id, CAST(substr(value, 1, 200) AS TEXT) FROM StringIds "
                             f"WHERE id IN ({','.join(map(str, ids))})").fetchall()) if ids else {}
    for row, name_id in chosen.items():
        names[row] = str(text.get(name_id, "") or "")


def read_contexts(conn: sqlite3.Connection, schema: Schema) -> dict[int, list[int]]:
    """pid -> the CUDA devices it has a context on (green contexts, which share their parent's
    memory, left out)."""
    table = "TARGET_INFO_CUDA_CONTEXT_INFO"
    if not schema.has(table, "processId", "deviceId"):
        return {}
    green = "isGreenContext" if schema.has(table, "isGreenContext") else "0"
    found: dict[int, set[int]] = {}
    for pid, device, is_green in conn.execute(f"SELECT processId, deviceId, {green} FROM {table}"):
        if isinstance(pid, int) and isinstance(device, int) and not is_green:
            found.setdefault(pid, set()).add(device)
    return {pid: sorted(devices) for pid, devices in sorted(found.items())}


def empty_code_calls() -> pd.DataFrame:
    return pd.DataFrame({"ts_ns": np.zeros(0, "int64"), "end_ns": np.zeros(0, "int64"),
                         "pid": np.zeros(0, "int64"), "tid": np.zeros(0, "int64"),
                         "api": np.zeros(0, object), "what": np.zeros(0, object)})


def code_call_ids(conn: sqlite3.Connection, schema: Schema) -> dict[int, str]:
    """StringIds id -> name (without its version suffix) of the names in WHAT; {} without the API
    table or without such names."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not (schema.has(table, "start", "nameId", "globalTid") and schema.has("StringIds", "id", "value")):
        return {}
    # Only short names starting with "cu" can be API names (StringIds also holds every NVTX text).
    return {string_id: name for string_id, value in conn.execute(
        "SELECT id, value FROM StringIds WHERE value LIKE 'cu%' AND length(value) < 64")
        if (name := apis.base_name(str(value))) in WHAT and isinstance(string_id, int)}


CODE_ROW_COLUMNS = ["start", "end", "global_tid", "name_id"]


def read_code_calls(conn: sqlite3.Connection, schema: Schema, raw: Optional[pd.DataFrame] = None) -> pd.DataFrame:
    """The calls named in WHAT, in time order (ns from the session start), with the API name
    without its version suffix; an empty frame without the API table or without such calls.
    `raw`: their rows (CODE_ROW_COLUMNS, in rowid order), when already read (events/load.py reads
    them in the scan of the memory calls: one scan of the API table, not two)."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    ids = code_call_ids(conn, schema)
    if not ids:
        return empty_code_calls()
    if raw is None:
        end = '"end"' if schema.has(table, "end") else "start"
        raw = read_table(conn, table, f"start, {end}, globalTid, nameId", CODE_ROW_COLUMNS,
                         where=f"nameId IN ({','.join(str(i) for i in sorted(ids))})")
    # A damaged export's text or out-of-range numbers become NULLs (columns.ints); a call without
    # a start is left out.
    start = ints(raw, "start")
    raw = raw[start.notna().to_numpy()]
    if raw.empty:
        return empty_code_calls()
    start = ints(raw, "start").to_numpy("int64")
    end = ints(raw, "end").to_numpy("int64", na_value=0)
    end = np.where(ints(raw, "end").isna().to_numpy(), start, np.maximum(end, start))
    tid = ints(raw, "global_tid").to_numpy("int64", na_value=0)
    api = raw["name_id"].map(ids).astype(object)
    calls = pd.DataFrame({
        "ts_ns": start - schema.time_offset_ns, "end_ns": end - schema.time_offset_ns,
        "pid": (tid >> 24) & 0xFFFFFF, "tid": tid & 0xFFFFFF, "api": api.to_numpy(),
        "what": api.map(WHAT).to_numpy(),
    })
    return calls.sort_values("ts_ns", kind="stable").reset_index(drop=True)
