"""The launch sequence of a process: its kernel launches (named by the kernel they launched),
copies and synchronizations in host time order, the trace's own record of what a program does
again and again when it runs a loop (analyses/iterations.py finds its steps from it when no NVTX
range marks them). With the other `events/read*.py` modules and `schema.py`, the only code that names nsys
tables and columns.

A launch's row in the API table (`CUPTI_ACTIVITY_KIND_RUNTIME`) has the host time and thread but
only the API's name (`cudaLaunchKernel_v7000`); the kernel's name is on its row in
`CUPTI_ACTIVITY_KIND_KERNEL`, joined on (process, correlationId) (nsys-schema.md §2.3). A kernel
launched inside a stream capture has no kernel row: its launch keeps the API's name.
"""

from __future__ import annotations

import sqlite3
from typing import Optional

import numpy as np
import pandas as pd

from ..base import apis
from ..sources.reader import read_frame
from ..sources.schema import Schema

LAUNCH_APIS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernelMultiDevice",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernelMultiDevice",
    "cudaGraphLaunch", "cuGraphLaunch",
})
# kind of each row: a kernel launch, a synchronization (the host waits for the GPU: a step's end
# when it reads its loss), or a copy
KERNEL, SYNC, COPY = 0, 1, 2
LAUNCH_COLUMNS = ["pid", "tid", "ts_ns", "end_ns", "token", "kind"]  # token: StringIds id of the kernel or API name


def empty_launches() -> pd.DataFrame:
    return pd.DataFrame({"pid": pd.Series(dtype="int32"), "tid": pd.Series(dtype="int32"), "ts_ns": pd.Series(dtype="int64"),
                         "end_ns": pd.Series(dtype="int64"), "token": pd.Series(dtype="int64"),
                         "kind": pd.Series(dtype="int8")})


def _kind(api: str) -> Optional[int]:
    name = apis.base_name(api)
    if name in LAUNCH_APIS:
        return KERNEL
    if "Synchronize" in name:  # cudaStreamSynchronize, cudaDeviceSynchronize, cuCtxSynchronize, ...
        return SYNC
    if name.startswith(("cudaMemcpy", "cuMemcpy")):
        return COPY
    return None


def read_launches(conn: sqlite3.Connection, schema: Schema, pids: list[int]) -> tuple[pd.DataFrame, dict[int, str]]:
    """The launches, copies and synchronizations of the given processes (LAUNCH_COLUMNS, sorted by
    process and host start), and the names of their tokens. Empty without the API table."""
    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if not pids or not schema.has(table, "start", "end", "nameId", "globalTid", "correlationId") \
            or not schema.has("StringIds", "id", "value"):
        return empty_launches(), {}
    kinds = {string_id: kind for string_id, value in conn.execute(
        "SELECT id, value FROM StringIds WHERE value LIKE 'cu%' AND length(value) < 64")
        if isinstance(string_id, int) and (kind := _kind(str(value))) is not None}
    if not kinds:
        return empty_launches(), {}
    # The backtrace twin of a call (eventClass 67, nsys-schema.md §3.2) is the same call again.
    twin = "AND eventClass != 67" if schema.has(table, "eventClass") else ""
    pid_list = ",".join(str(int(p)) for p in sorted(pids))
    rows = read_frame(conn, f"SELECT start, \"end\", globalTid, correlationId, nameId FROM {table} "
                            f"WHERE nameId IN ({','.join(str(i) for i in sorted(kinds))}) {twin} "
                            f"AND ((globalTid >> 24) & 16777215) IN ({pid_list})",
                      ["start", "end", "global_tid", "correlation_id", "name_id"]).dropna()
    if rows.empty:
        return empty_launches(), {}
    pid = ((rows["global_tid"].to_numpy("int64") >> 24) & 0xFFFFFF).astype("int32")
    name_id = rows["name_id"].to_numpy("int64")
    kind = pd.Series(name_id).map(kinds).to_numpy("int8")
    token = name_id.copy()
    kernels = _kernel_names(conn, schema, pid_list)
    if not kernels.empty:  # the kernel each launch launched (a graph launch: its first kernel)
        at = pd.MultiIndex.from_arrays([kernels["pid"], kernels["correlation_id"]]).get_indexer(
            pd.MultiIndex.from_arrays([pid, rows["correlation_id"].to_numpy("int64")]))
        named = (at >= 0) & (kind == KERNEL)
        token[named] = kernels["short_name"].to_numpy("int64")[at[named]]
    start = rows["start"].to_numpy("int64") - schema.time_offset_ns
    launches = pd.DataFrame({"pid": pid, "tid": (rows["global_tid"].to_numpy("int64") & 0xFFFFFF).astype("int32"),
                             "ts_ns": start,
                             "end_ns": np.maximum(rows["end"].to_numpy("int64") - schema.time_offset_ns, start),
                             "token": token, "kind": kind})
    launches = launches.sort_values(["pid", "ts_ns"], kind="stable", ignore_index=True)
    return launches, _names(conn, np.unique(token))


def _kernel_names(conn: sqlite3.Connection, schema: Schema, pid_list: str) -> pd.DataFrame:
    table = "CUPTI_ACTIVITY_KIND_KERNEL"
    if not schema.has(table, "globalPid", "correlationId", "shortName"):
        return pd.DataFrame()
    kernels = read_frame(conn, f"SELECT (globalPid >> 24) & 16777215, correlationId, min(shortName) FROM {table} "
                               f"WHERE ((globalPid >> 24) & 16777215) IN ({pid_list}) GROUP BY 1, 2",
                         ["pid", "correlation_id", "short_name"]).dropna()
    return kernels.astype("int64")


def _names(conn: sqlite3.Connection, ids: np.ndarray) -> dict[int, str]:
    names: dict[int, str] = {}
    listed = [int(i) for i in ids]
    for low in range(0, len(listed), 10_000):  # SQLite's limit on terms in one statement
        part = ",".join(str(i) for i in listed[low:low + 10_000])
        for string_id, value in conn.execute(f"SELECT id, CAST(substr(value, 1, 200) AS TEXT) FROM StringIds "
                                             f"WHERE id IN ({part})"):
            names[int(string_id)] = str(value)
    return names
