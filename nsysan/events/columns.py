"""The columns of the frames `load_events` returns, and conversions of raw export columns.

EVENT_COLUMNS (one row per allocation or free, in time order; frees before allocations at the
same timestamp, so a peak is never overstated; the row position is the event's sequence number):
"""

from __future__ import annotations

import numpy as np
import pandas as pd


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
    "operator": "category",  # innermost PyTorch operator range open on the thread (aten::empty), "" if none
    "stack": "int32",  # the allocation's own call stack (index in LoadedEvents.stacks), -1 if none
}
__doc__ += "\n".join(f"    {name}: {dtype}" for name, dtype in EVENT_COLUMNS.items())


CALL_COLUMNS = {
    "ts_ns": "int64", "end_ns": "int64", "pid": "int32", "tid": "int32", "api": "category",
    "family": "category", "return_value": "int32", "correlation_id": "int64",
    "has_event": "bool",  # the call caused at least one memory event
}


SITE_COLUMNS = ["label", "function", "symbol", "module", "from_stack", "source", "file", "line", "context",
                "stack_id"]


def empty_calls() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=t) for c, t in CALL_COLUMNS.items()})


def empty_chains() -> pd.DataFrame:
    return pd.DataFrame({"pid": np.zeros(0, "int32"), "correlation_id": np.zeros(0, "int64"),
                         "callchain_id": np.zeros(0, "int64"), "tid": np.zeros(0, "int32"),
                         "ts_ns": np.zeros(0, "int64"), "end_ns": np.zeros(0, "int64")})


def empty_ranges() -> pd.DataFrame:
    return pd.DataFrame({"pid": pd.Series(dtype="int32"), "tid": pd.Series(dtype="int32"),
                         "start_ns": pd.Series(dtype="int64"), "end_ns": pd.Series(dtype="int64"),
                         "name": pd.Series(dtype="object"), "depth": pd.Series(dtype="int16"),
                         "parent": pd.Series(dtype="int64")})


def empty_sites() -> pd.DataFrame:
    return pd.DataFrame(columns=SITE_COLUMNS)


def ints(frame: pd.DataFrame, column: str) -> pd.Series:
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
    # A fraction is no value nsys writes (1.5 bytes, a time between two ns): unreadable, as text
    # is, not truncated into a number that looks real
    finite = np.isfinite(floats) & (np.floor(floats) == floats)
    out = pd.array(np.where(finite, np.clip(floats, -2.0**62, 2.0**62), 0).astype("int64"), dtype="Int64")
    out[~finite] = pd.NA
    return pd.Series(out, index=values.index)


def int_column(frame: pd.DataFrame, column: str, dtype: str = "int64", fill: int = 0) -> np.ndarray:
    """A column as a plain integer array, NULLs and non-numbers replaced by `fill`."""
    values = frame[column]
    # The common case: no NULLs, no copy. Not for pandas' nullable Int64 (also kind "i"), whose
    # NULLs would become garbage integers.
    if isinstance(values.dtype, np.dtype) and values.dtype.kind in "iu":
        return values.to_numpy().astype(dtype, copy=False)
    return ints(frame, column).to_numpy(dtype=dtype, na_value=fill)


def categorical_lookup(values: np.ndarray, lookup: dict, missing: str = "?") -> pd.Categorical:
    """`lookup[v]` for every value, as a categorical: one dictionary lookup per distinct value."""
    values = np.asarray(values)
    if values.dtype.kind in "iu" and len(values) and 0 <= values.min() and values.max() < 1 << 16:
        # Enum and string ids: a count per value finds the distinct ones, and a table maps them,
        # without pandas' hash pass (0.2 s per 1e7 values)
        uniques = np.flatnonzero(np.bincount(values))
        codes = None
    else:
        codes, uniques = pd.factorize(values)
    names = [lookup.get(u.item() if hasattr(u, "item") else u, missing) for u in uniques]
    categories = list(dict.fromkeys(names))  # several values may share a name
    position = {name: i for i, name in enumerate(categories)}
    # codes of the width pandas keeps them in, so that from_codes does not convert them again
    remap = np.array([position[n] for n in names], dtype=pd.Categorical([], categories=categories).codes.dtype)
    if codes is None:  # a table from each value to its name's code: one gather
        code_of = np.zeros(int(uniques[-1]) + 1, remap.dtype)
        code_of[uniques] = remap
        return pd.Categorical.from_codes(code_of[values], categories=categories)
    return pd.Categorical.from_codes(remap[codes] if len(codes) else codes, categories=categories)
