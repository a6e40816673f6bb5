"""The memory-pool queries (`cudaMallocAsync` and other stream-ordered allocators): the pool rows
among the memory table's rows (`localMemoryPoolAddress`, `localMemoryPoolSize`) and the pools'
creations, trims and destructions (`CUDA_GPU_MEMORY_POOL_EVENTS`). With the other
`events/read*.py` modules and `schema.py`, the only code that names nsys tables and columns.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd

from ..sources.reader import read_frame
from ..sources.schema import Schema
from .columns import int_column, ints
from .read import _col


# ENUM_CUDA_MEMPOOL_OPER and ENUM_CUDA_MEMPOOL_TYPE: the same ids in every schema seen (3.0 to 3.20)
POOL_OPERATIONS = {1: "created", 2: "destroyed", 3: "trimmed"}
POOL_TYPES = {1: "local", 2: "imported"}
POOL_USAGE_COLUMNS = ["ts_ns", "pid", "device", "address", "is_alloc", "bytes", "reserved"]  # see pool_usage
POOL_EVENT_COLUMNS = ["ts_ns", "pid", "device", "address", "operation", "pool_type", "reserved"]


def empty_pool_usage() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="bool" if c == "is_alloc" else "int64") for c in POOL_USAGE_COLUMNS})


def empty_pool_events() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object" if c in ("operation", "pool_type") else "int64")
                         for c in POOL_EVENT_COLUMNS})


def pool_usage(raw: pd.DataFrame, schema: Schema) -> pd.DataFrame:
    """The pool allocations and frees among the raw memory rows (read.MEMORY_COLUMNS), with their
    pool's reserve then (`localMemoryPoolSize`, schema 3.0+): POOL_USAGE_COLUMNS, in time order.
    Call it before `normalize` consumes the raw columns."""
    if raw.empty or "pool_size" not in raw:
        return empty_pool_usage()
    rows = np.flatnonzero(int_column(raw, "pool_address") != 0)
    # a row without a usable time is left out, as the events leave it out: it has no place in time
    start = raw["start"].iloc[rows]
    no_start = np.zeros(len(rows), bool) if isinstance(start.dtype, np.dtype) and start.dtype.kind in "iu" \
        else ints(raw.iloc[rows], "start").isna().to_numpy()
    rows = rows[usable_times(int_column(raw, "start")[rows], no_start, schema.time_offset_ns)]
    if len(rows) == 0:
        return empty_pool_usage()
    alloc_ids = [i for i, name in schema.mem_ops.items() if name == "alloc"]
    found = pd.DataFrame({
        "ts_ns": int_column(raw, "start")[rows] - schema.time_offset_ns,
        "pid": ((int_column(raw, "global_pid")[rows] >> 24) & 0xFFFFFF).astype("int32"),
        "device": np.clip(int_column(raw, "device")[rows], -1, 32767).astype("int16"),
        "address": int_column(raw, "pool_address")[rows],
        "is_alloc": np.isin(int_column(raw, "op_type", fill=-1)[rows], alloc_ids),
        "bytes": np.clip(int_column(raw, "bytes")[rows], 0, 2**50),
        "reserved": np.clip(int_column(raw, "pool_size")[rows], 0, 2**50),
        "block": int_column(raw, "address")[rows], "call": int_column(raw, "correlation_id")[rows],
        **({"position": int_column(raw, "position")[rows]} if "position" in raw else {}),
    })
    if "position" in found:  # rows read out of export order: back into it first
        found = found.sort_values("position", kind="stable").drop(columns=["position"])
    # rows written twice (an export written twice into one file) count once, as in normalize
    found = found[~found.duplicated().to_numpy()].drop(columns=["block", "call"])
    return found.sort_values("ts_ns", kind="stable", ignore_index=True)


def usable_times(start: np.ndarray, start_null: np.ndarray, time_offset_ns: int) -> np.ndarray:
    """Which `start`s place a row in time: not NULL, within ±2^61 ns (73 years) of the export's
    time shift (normalize leaves other memory rows out: their sort keys would wrap)."""
    return ~start_null & (np.abs(np.clip(start, -2**62, 2**62) - time_offset_ns) <= 2**61)


def read_pool_events(conn: sqlite3.Connection, schema: Schema) -> pd.DataFrame:
    """Pool creations, trims and destructions (`CUDA_GPU_MEMORY_POOL_EVENTS`): POOL_EVENT_COLUMNS."""
    table = "CUDA_GPU_MEMORY_POOL_EVENTS"
    if not schema.has(table, "start", "globalPid", "address", "operationType"):
        return empty_pool_events()
    sql = (f"SELECT start, globalPid, {_col(schema, table, 'deviceId', '0')}, address, operationType, "
           f"{_col(schema, table, 'poolType', '0')}, coalesce({_col(schema, table, 'localMemoryPoolSize', '0')}, 0) "
           f"FROM {table}")
    raw = read_frame(conn, sql, ["start", "global_pid", "device", "address", "operation", "pool_type", "reserved"])
    return pd.DataFrame({
        "ts_ns": int_column(raw, "start") - schema.time_offset_ns,
        "pid": ((int_column(raw, "global_pid") >> 24) & 0xFFFFFF).astype("int32"),
        "device": np.clip(int_column(raw, "device"), -1, 32767).astype("int16"), "address": int_column(raw, "address"),
        "operation": [POOL_OPERATIONS.get(v, "") for v in int_column(raw, "operation").tolist()],
        "pool_type": [POOL_TYPES.get(v, "") for v in int_column(raw, "pool_type").tolist()],
        "reserved": np.clip(int_column(raw, "reserved"), 0, 2**50),
    }).drop_duplicates(ignore_index=True)
