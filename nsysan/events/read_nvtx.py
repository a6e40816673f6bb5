"""The NVTX ranges' query: push/pop and start/end ranges, the user's and PyTorch's operator ranges,
with their nesting. With `read.py`, `read_pools.py`, `read_launches.py`, `read_start.py` and
`schema.py`, the only code that names nsys tables and columns.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd

from ..sources.reader import read_frame
from ..sources.schema import Schema, _quote
from .columns import empty_ranges, int_column, ints
from .nvtx import nesting_depth, parents, thread_key


# Push/pop ranges belong to one thread (59 NvtxPushPopRange, 70 NvtxtPushPopRange); start/end
# ranges (60 NvtxStartEndRange, 71 NvtxtStartEndRange: nvtxRangeStart/End,
# torch.cuda.nvtx.range_start/range_end) may end on another thread than the one they started on,
# so they are the process's: read as ranges of its main thread (tid = pid), which is where an
# event on a thread without a range of its own is looked up (nvtx.innermost_range_rows), and
# where steps are looked for first.
NVTX_PUSH_POP = (59, 70)
NVTX_START_END = (60, 71)


NVTX_NAME_CHARS = 200  # NVTX texts can be megabytes; names are cut here, in SQL.


def read_nvtx_ranges(conn: sqlite3.Connection, schema: Schema) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Push/pop and start/end NVTX ranges (NVTX_START_END): the user's, and PyTorch's operator ranges
    (`--pytorch=autograd-nvtx`).

    Each frame has the nesting depth of a range among its kind on its thread (1 = outermost) and
    the row of the range of its kind that encloses it (-1 for outermost ones). An operator range's
    text is `aten::addmm, seq = 12, op_id = 345, sizes = [...]`: its name is the operator, the text
    before the first comma, so that a million instances make a handful of names.
    """
    table = "NVTX_EVENTS"
    if not schema.has(table, "start", "eventType", "globalTid"):
        return empty_ranges(), empty_ranges()
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
    types = ",".join(str(t) for t in NVTX_PUSH_POP + NVTX_START_END)
    # The operator name is cut in SQL: far less text crosses into Python than the whole texts.
    # The test runs on the raw column (emit_nvtx never registers its strings): on the cut name it
    # would make SQLite build that expression once per use, three times slower.
    is_operator = " OR ".join(f"instr({text}, '{mark}') > 1" for mark in OPERATOR_MARKS)
    operator_name = f"CAST(substr({text}, 1, instr({text}, ',') - 1) AS TEXT)"
    sql = (f"SELECT n.start, {end}, n.globalTid, CASE WHEN {is_operator} THEN {operator_name} ELSE {name_sql} END, "
           f"coalesce({is_operator}, 0), n.eventType IN ({','.join(str(t) for t in NVTX_START_END)}) "
           f"FROM {table} AS n {join} WHERE n.eventType IN ({types})")
    raw = read_frame(conn, sql, ["start", "end", "global_tid", "name", "operator", "start_end"])
    if raw.empty:
        return empty_ranges(), empty_ranges()
    global_tid = int_column(raw, "global_tid")
    start = int_column(raw, "start") - schema.time_offset_ns
    end_values = ints(raw, "end")
    # An unterminated range (end NULL) stays open to the end of the capture.
    open_end = np.iinfo("int64").max // 2
    end = np.where(end_values.isna().to_numpy(), open_end,
                   end_values.fillna(0).to_numpy(dtype="int64") - schema.time_offset_ns)
    pid = ((global_tid >> 24) & 0xFFFFFF).astype("int32")
    ranges = pd.DataFrame({
        "pid": pid, "tid": np.where(int_column(raw, "start_end") != 0, pid, global_tid & 0xFFFFFF).astype("int32"),
        "start_ns": start, "end_ns": np.maximum(end, start), "name": _range_names(raw["name"]),
    })
    operator = int_column(raw, "operator") != 0
    if not operator.any():
        return _nested(ranges), empty_ranges()
    return _nested(ranges[~operator]), _nested(ranges[operator])


# Text after an operator's name in PyTorch's emit_nvtx ranges (with or without shapes)
OPERATOR_MARKS = (", seq = ", ", op_id = ")


def _range_names(names: pd.Series) -> np.ndarray:
    """Range texts with runs of whitespace as one space, cleaned once per distinct text (a million
    operator ranges have a few dozen names; the column is factorized as the reader gave it)."""
    codes, uniques = pd.factorize(names)
    cleaned = pd.Series(np.append(np.asarray(uniques, dtype=object), "")).fillna("").astype(str)
    return cleaned.str.replace(r"\s+", " ", regex=True).to_numpy(dtype=object)[codes]  # code -1 (NULL): ""


def _nested(ranges: pd.DataFrame) -> pd.DataFrame:
    """Ranges sorted per thread by start (longest first at equal starts), with depth and parent."""
    if ranges.empty:
        return empty_ranges()
    ranges = ranges.sort_values(["pid", "tid", "start_ns", "end_ns"], ascending=[True, True, True, False],
                                kind="stable", ignore_index=True)
    ranges["depth"] = nesting_depth(ranges)
    # Ranges are sorted per thread by start, the order parents expects.
    ranges["parent"] = parents(ranges, np.arange(len(ranges)),
                               thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy()),
                               ranges["depth"].to_numpy().astype("int64"))
    return ranges
