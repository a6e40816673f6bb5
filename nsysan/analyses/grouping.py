"""Exact per-group sums, counts, maxima and running sums over 1e7 events, in O(n).

pandas' groupby is general but costs several passes per aggregation; np.bincount is fast but
sums in float64, which is not exact above 2^53 bytes (8 PiB: a sum of allocation sizes over a
long training job gets there). Sorting the events by group once (a counting sort) and reducing
contiguous segments with numpy's `reduceat` is both exact and linear.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..events.arrays import group_order


# Up to this many groups, per-group work on slices is cheaper than an array of n built for it.
MANY_GROUPS = 10_000


class Segments:
    """Events brought together by group code (0 <= code < groups), each group in time order."""

    def __init__(self, codes: np.ndarray, groups: int) -> None:
        self.groups = groups
        self.order = group_order(codes, groups)
        if len(codes) and codes.min() >= 0 and codes.max() < groups:
            # A group starts after the events of the groups before it (no sorted copy of the codes).
            self.sizes = np.bincount(codes, minlength=groups).astype("int64")
            self.starts = np.cumsum(self.sizes) - self.sizes
        else:  # codes outside 0..groups-1 (none expected): where a sorted copy puts them
            self.starts = np.searchsorted(codes[self.order], np.arange(groups))
            self.sizes = np.diff(np.append(self.starts, len(codes)))
        self.present = self.sizes > 0

    def _reduce(self, ufunc: np.ufunc, values: np.ndarray, empty: int = 0, ordered: bool = False) -> np.ndarray:
        """ufunc over each group's values; `ordered`: the values are already in segment order."""
        result = np.full(self.groups, empty, dtype=values.dtype)
        if self.present.any():
            result[self.present] = ufunc.reduceat(values if ordered else values[self.order],
                                                  self.starts[self.present])
        return result

    def count(self, mask: np.ndarray | None = None, ordered: bool = False) -> np.ndarray:
        if mask is None:
            return self.sizes.astype("int64")
        values = mask if ordered else mask[self.order]
        result = np.zeros(self.groups, "int64")
        if self.present.any():  # summed as int64 by reduceat itself: no int64 copy of the mask (80 MB at 1e7)
            result[self.present] = np.add.reduceat(values, self.starts[self.present], dtype="int64")
        return result

    def sum(self, values: np.ndarray, ordered: bool = False) -> np.ndarray:
        return self._reduce(np.add, values.astype("int64", copy=False), ordered=ordered)

    def max(self, values: np.ndarray, ordered: bool = False) -> np.ndarray:
        return self._reduce(np.maximum, values, empty=np.iinfo(values.dtype).min, ordered=ordered)

    def last(self, values: np.ndarray, ordered: bool = False) -> np.ndarray:
        """The value at each group's last event (its latest, since events are in time order)."""
        result = np.zeros(self.groups, dtype=values.dtype)
        ends = self.starts + self.sizes - 1
        result[self.present] = values[ends[self.present] if ordered else self.order[ends[self.present]]]
        return result

    def in_group_order(self, values: np.ndarray) -> np.ndarray:
        """`values` of every event, brought into segment order (group g at starts[g]:starts[g] + sizes[g])."""
        return values[self.order]

    def running_sums(self, values: np.ndarray) -> np.ndarray:
        """Per event, the sum of its group's values up to and including it, in segment order (the
        way back to event order, a scatter and 80 MB at 1e7 events, is left to whoever needs it)."""
        ordered = values[self.order].astype("int64", copy=False)
        np.cumsum(ordered, out=ordered)  # in place: one array of n, not three
        before = np.zeros(self.groups, "int64")
        nonfirst = self.present & (self.starts > 0)
        before[nonfirst] = ordered[self.starts[nonfirst] - 1]
        if self.groups <= MANY_GROUPS:
            for group in np.flatnonzero(nonfirst):  # one per group
                ordered[self.starts[group]:self.starts[group] + self.sizes[group]] -= before[group]
        else:
            ordered -= np.repeat(before, self.sizes)
        return ordered

    def first_row_of_max(self, values: np.ndarray, ordered: bool = False) -> np.ndarray:
        """Per group, the event row where `values` first reaches the group's maximum (-1 if empty)."""
        ordered = values if ordered else values[self.order]
        if self.groups <= MANY_GROUPS:  # argmax of each group's slice: its first maximum, no array of n
            first = np.full(self.groups, -1, "int64")
            for group in np.flatnonzero(self.present).tolist():  # one per group
                start = int(self.starts[group])
                first[group] = self.order[start + int(np.argmax(ordered[start:start + int(self.sizes[group])]))]
            return first
        highest = self.max(ordered, ordered=True)
        group_of = np.repeat(np.arange(self.groups), self.sizes)
        positions = np.where(ordered == highest[group_of], np.arange(len(ordered)), len(ordered))
        first = self._reduce(np.minimum, positions, empty=len(ordered), ordered=True)
        return np.where(self.present, self.order[np.minimum(first, max(len(ordered) - 1, 0))], -1)


def code_sums(codes: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """The int64 sum of `values` per code 0..size-1 (`codes`: each row's), by one pass in row
    order into a table of the codes (np.add.at: exact, and at 1e7 events faster than a float
    bincount's weights or than gathering the rows in code order)."""
    table = np.zeros(size, "int64")
    np.add.at(table, codes, values)
    return table


@dataclass
class Keyed:
    """Integer keys numbered in order of first appearance, with per-key int64 columns that grow."""

    columns: tuple[str, ...]
    fill: dict = field(default_factory=dict)
    index: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data = {c: np.zeros(0, "int64") for c in self.columns}

    def codes(self, keys: np.ndarray) -> np.ndarray:
        slot, distinct = pd.factorize(keys)  # a hash pass, not a sort of the batch
        for k in distinct.tolist():
            if k not in self.index:
                self.index[k] = len(self.index)
        if len(self.index) > len(self.data[self.columns[0]]):
            grow = len(self.index) - len(self.data[self.columns[0]])
            for c in self.columns:
                self.data[c] = np.concatenate([self.data[c], np.full(grow, self.fill.get(c, 0), "int64")])
        return np.array([self.index[k] for k in distinct.tolist()], "int64")[slot]

    def __getitem__(self, column: str) -> np.ndarray:
        return self.data[column]

    def keys(self) -> list[int]:
        return list(self.index)
