"""Linear-time helpers over integer codes for 1e7-row arrays: numbering, ordering, previous row.

The events are normalized with them and the analyses group with them (see analyses/grouping.py).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import numpy as np
import pandas as pd

from ..sources.reader import PARALLEL_MIN_ROWS, usable_cpus

T = TypeVar("T")


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


def on_every_core(work: Callable[[T], None], items: list[T], parallel: bool = True) -> None:
    """work(item) for every item, on as many threads as there are usable cores (numpy's sorts,
    searches and gathers run without the GIL), for work that writes only its own part of a shared
    result; in order on this thread with one core or one item, or when not `parallel` (inputs too
    small for threads to pay)."""
    workers = min(usable_cpus(), len(items)) if parallel else 1
    if workers < 2:
        for item in items:
            work(item)
        return
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(work, items))


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


# Rows packed at a time by distinct_pairs: int64 temporaries of one chunk, not of every event.
PAIR_CHUNK = 1 << 20


def distinct_pairs(high: np.ndarray, low: np.ndarray, shift: int, mask: int) -> np.ndarray:
    """pd.unique((high << shift) | (low & mask)) as int64, in order of first appearance, packed a
    chunk at a time (for 1e7 events at once, the int64 temporaries took 0.4 GB)."""
    parts = []
    for start in range(0, len(high), PAIR_CHUNK):
        packed = high[start:start + PAIR_CHUNK].astype("int64")
        packed <<= shift
        packed |= low[start:start + PAIR_CHUNK].astype("int64") & mask
        parts.append(pd.unique(packed))
    return pd.unique(np.concatenate(parts)) if parts else np.zeros(0, "int64")


def among(values: np.ndarray, few) -> np.ndarray:
    """np.isin(values, few) for a few values (kinds, processes, (process, device) pairs), by
    comparison with each: numpy's default for a few small integers builds a lookup table, 4-7 ms
    per 2^18 rows against under 1 (0.1 s per peak series over 1e7 rows against 0.015)."""
    return np.isin(values, few, kind="sort")


def category_codes(column: pd.Series) -> np.ndarray:
    """The codes of a categorical column as a read-only view: `Series.cat.codes` copies all of them
    (1.6 ms at 1e7 rows), which the analyses that look at a few rows per process or spike paid
    thousands of times on a capture of 5,000 processes."""
    return column.array.codes


def distinct_rows(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's number among the distinct rows of the integer `columns`, numbered in order of first
    appearance, and the first row of each: hashed a column at a time (the codes stay under the row
    count, so two of them always pack into one int64), not as a MultiIndex of objects."""
    slot = np.zeros(len(columns[0]), "int64")
    for column in columns:
        codes, uniques = pd.factorize(np.asarray(column, "int64"))
        slot, _ = pd.factorize(slot * len(uniques) + codes)
    # numbered in order of first appearance, a row is its number's first where the numbers so far
    # reach a new maximum: one pass, not a sort
    return slot, np.flatnonzero(np.diff(np.maximum.accumulate(slot), prepend=-1) > 0)


LOW, HIGH = np.iinfo("int64").min, np.iinfo("int64").max


def running_sums(codes: np.ndarray, values: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Each row's running sum of `values` within its code, starting from `carry[code]`; `carry`
    is left holding each code's sum after the last row (codes in 0..len(carry))."""
    if len(codes) == 0:
        return np.zeros(0, "int64")
    order = group_order(codes, len(carry))  # a counting sort: the codes are few
    in_order, sorted_codes = values[order].astype("int64"), codes[order]
    summed = np.cumsum(in_order)
    starts = np.flatnonzero(np.concatenate([[True], sorted_codes[1:] != sorted_codes[:-1]]))
    lengths = np.diff(np.append(starts, len(order)))
    summed -= np.repeat(summed[starts] - in_order[starts] - carry[sorted_codes[starts]], lengths)
    carry[sorted_codes[starts]] = summed[starts + lengths - 1]
    result = np.empty_like(summed)
    result[order] = summed
    return result


def pair_key(pid: np.ndarray, device: np.ndarray) -> np.ndarray:
    """(process, device) packed into one int64: the pid above 16 bits of the device."""
    return (pid.astype("int64") << 16) | (device.astype("int64") & 0xFFFF)


def pair_of(key: int) -> tuple[int, int]:
    """(process, device) of a pair_key."""
    return key >> 16, (key & 0xFFFF) - 0x10000 if key & 0x8000 else key & 0xFFFF


def one_pair_key(pid: int, device: int) -> int:
    """pair_key of one (process, device)."""
    return int(pair_key(np.array([pid]), np.array([device]))[0])
