"""The few CUDA API calls that change GPU memory without a memory event: context creation, code
(module and library) loads, stream capture and CUDA graphs (analyses/hidden.py, analyses/graphs.py).

One query on the API table, filtered by the StringIds ids of just these names: when the export
holds none of them (most large exports never load a library after start-up nor capture a graph,
and no export before CUDA 10 has graph calls), the API table is not scanned at all.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import apis
from ..reader import read_table
from ..schema import Schema
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
CODE_CALL_COLUMNS = ["ts_ns", "end_ns", "pid", "tid", "api", "what"]


@dataclass
class CodeTrace:
    """The calls named in WHAT (`calls`, see read_code_calls) and the CUDA devices each process
    has a context on (`contexts`: pid -> devices, from TARGET_INFO_CUDA_CONTEXT_INFO; {} when the
    export lacks it, as before nsys 2023)."""

    calls: pd.DataFrame
    contexts: dict[int, list[int]] = field(default_factory=dict)


def read_code_trace(conn: sqlite3.Connection, schema: Schema) -> CodeTrace:
    return CodeTrace(read_code_calls(conn, schema), read_contexts(conn, schema))


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


def read_code_calls(conn: sqlite3.Connection, schema: Schema) -> pd.DataFrame:
    """The calls named in WHAT, in time order (ns from the session start), with the API name
    without its version suffix; an empty frame without the API table or without such calls."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not (schema.has(table, "start", "nameId", "globalTid") and schema.has("StringIds", "id", "value")):
        return empty_code_calls()
    # Only short names starting with "cu" can be API names (StringIds also holds every NVTX text).
    ids = {}
    for string_id, value in conn.execute("SELECT id, value FROM StringIds WHERE value LIKE 'cu%' "
                                         "AND length(value) < 64"):
        name = apis.base_name(str(value))
        if name in WHAT and isinstance(string_id, int):
            ids[string_id] = name
    if not ids:
        return empty_code_calls()
    end = '"end"' if schema.has(table, "end") else "start"
    raw = read_table(conn, table, f"start, {end}, globalTid, nameId", ["start", "end", "global_tid", "name_id"],
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
