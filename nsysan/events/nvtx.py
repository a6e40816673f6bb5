"""NVTX push/pop ranges: their nesting, and the innermost range open at any point of a thread."""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from .arrays import on_every_core


MAX_NVTX_DEPTH = 64
# Points looked up at a time: each step of the lookup makes a few int64 arrays per point, which
# for 1e7 events at once came to 0.6 GB over the frame.
POINT_CHUNK = 1 << 20


def attribute_ranges(points: pd.DataFrame, ranges: pd.DataFrame) -> tuple[pd.Categorical, pd.Categorical]:
    """Innermost NVTX range and range path open at each point (columns pid, tid, ts_ns).

    Looks on the point's own thread first, then on the process's main thread (tid == pid):
    PyTorch runs backward passes on autograd threads that have no ranges of their own.
    """
    n = len(points)
    if n == 0 or ranges.empty:
        empty = pd.Categorical.from_codes(np.zeros(n, "int8"), categories=[""])
        return empty, empty
    index = innermost_range_rows(points["pid"].to_numpy(), points["tid"].to_numpy(), points["ts_ns"].to_numpy(),
                                 ranges)
    return _as_categorical(ranges["name"].to_numpy(dtype=object), index), \
        _as_categorical(range_paths(ranges), index)


def innermost_range_rows(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Row in `ranges` of the innermost range open at each point (-1 for none): on its own
    thread, else on its process's main thread (see attribute_ranges)."""
    if len(ts) == 0 or ranges.empty:
        return np.full(len(ts), -1, "int64")
    return RangeLookup(ranges, (int(ts.min()), int(ts.max()))).rows(pid, tid, ts)


def _as_categorical(values: np.ndarray, index: np.ndarray) -> pd.Categorical:
    """values[index] ("" where index is -1) as a categorical, without building 1e7 strings."""
    codes, uniques = pd.factorize(np.append(values, ""))  # index -1 picks the last code: ""'s
    codes = codes.astype(np.min_scalar_type(-max(len(uniques), 1)))  # int8 for up to 128 names
    return pd.Categorical.from_codes(codes[index], categories=pd.Index(uniques, dtype=object))


def thread_key(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """pid << 24 | tid as int64: one number per thread (the key of analyses.steps.memory_threads too)."""
    return pid.astype("int64") << 24 | (tid.astype("int64") & 0xFFFFFF)


def _innermost(pid: np.ndarray, tid: np.ndarray, ts: np.ndarray, ranges: pd.DataFrame) -> np.ndarray:
    """Row of the innermost range containing each point on the given thread, -1 if none."""
    if len(ts) == 0 or ranges.empty:
        return np.full(len(ts), -1, "int64")
    return RangeLookup(ranges, (int(ts.min()), int(ts.max()))).innermost(pid, tid, ts)


class RangeLookup:
    """The ranges sorted once for lookups of points given a batch at a time (the streamed
    events): `rows` is innermost_range_rows, `innermost` the lookup on the given thread.

    `times`: the earliest and latest time of the points to come (every batch's); the axis then
    spans what innermost_range_rows' spans, and gives up where it gives up (an absurd span of
    damaged times). Without them the axis spans the ranges, and later points are looked up at the
    last range start (no range starts after it).
    """

    def __init__(self, ranges: pd.DataFrame, times: Optional[tuple[int, int]] = None) -> None:
        self.ranges = ranges
        self.usable = not ranges.empty
        if not self.usable:
            return
        start = ranges["start_ns"].to_numpy()
        self.range_threads, range_rank = np.unique(thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy()),
                                                   return_inverse=True)
        self.range_rank = range_rank.astype("int64")
        # One sorted axis for all threads: thread rank * span + time. A single searchsorted then
        # finds, for every point, the last range of its thread that started at or before it.
        low, high = int(start.min()), int(start.max())
        if times is not None:
            low, high = min(low, times[0]), max(high, times[1])
        self.origin, self.span = low, high - low + 1
        if self.span * len(self.range_threads) >= 2**62:  # absurd time spans (damaged exports): give up cleanly
            self.usable = False
            return
        range_axis = self.range_rank * self.span + (start - self.origin)
        self.order = np.argsort(range_axis, kind="stable")
        self.sorted_axis = range_axis[self.order]
        self.end = ranges["end_ns"].to_numpy()
        self.parent = ranges["parent"].to_numpy()
        # The innermost range of a thread changes only where one of its ranges starts or ends: it
        # is a step function of time, found once at each such moment (the walk below); a point
        # then takes the step it falls on, one search and no walk.
        last = self.origin + self.span - 1
        moments = np.concatenate([range_axis, self.range_rank * self.span + (self.end - self.origin)])
        moments = np.unique(moments[np.concatenate([start, self.end]) <= last])
        self.step_rank, self.step_axis = moments // self.span, moments
        self.step_value = self._walk(self.step_rank, moments % self.span + self.origin)

    def rows(self, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """innermost_range_rows of these points: on their own thread, else their process's main thread.
        A chunk at a time, both lookups: the points with no range on their own thread, looked up
        again, can be most of them (at 1e7 events their copies held 0.3 GB at once)."""
        result = np.full(len(ts), -1, "int64")
        if len(ts) == 0 or not self.usable:
            return result

        def fill(part: slice) -> None:
            index = self._innermost_of_chunk(pid[part], tid[part], ts[part])
            missing = np.flatnonzero(index < 0)
            if len(missing):
                main = pid[part][missing]
                index[missing] = self._innermost_of_chunk(main, main, ts[part][missing])
            result[part] = index

        on_every_core(fill, [slice(low, low + POINT_CHUNK) for low in range(0, len(ts), POINT_CHUNK)])
        return result

    def innermost(self, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Row of the innermost range containing each point on the given thread, -1 if none."""
        n = len(ts)
        result = np.full(n, -1, "int64")
        if n == 0 or not self.usable:
            return result

        def fill(part: slice) -> None:  # each point alone: a chunk at a time bounds the temporaries
            result[part] = self._innermost_of_chunk(pid[part], tid[part], ts[part])

        on_every_core(fill, [slice(low, low + POINT_CHUNK) for low in range(0, n, POINT_CHUNK)])
        return result

    def _innermost_of_chunk(self, pid: np.ndarray, tid: np.ndarray, ts: np.ndarray) -> np.ndarray:
        point_keys = thread_key(pid, tid)
        point_rank = np.clip(np.searchsorted(self.range_threads, point_keys), 0, len(self.range_threads) - 1)
        # a point before the axis has no range started before it; one after it, every range of its thread
        on_thread = (self.range_threads[point_rank] == point_keys) & (ts >= self.origin)
        high = self.origin + self.span - 1
        point_axis = point_rank.astype("int64") * self.span + (np.minimum(ts, high) - self.origin)
        # searched thread by thread: points in time order then look for ascending keys, which a
        # binary search finds in the pages the last one read (4 ms against 13 for 2^18 points
        # of four threads interleaved)
        by_thread = np.argsort(point_rank.astype(np.min_scalar_type(len(self.range_threads))), kind="stable")
        found_at = np.searchsorted(self.step_axis, point_axis[by_thread], side="right") - 1
        step = point_axis  # (its array reused: the whole frame looks up a million points at a time per core)
        step[by_thread] = found_at
        del found_at, by_thread
        found = on_thread & (step >= 0)
        step = np.maximum(step, 0, out=step)
        found &= self.step_rank[step] == point_rank
        result = np.where(found, self.step_value[step], -1)
        later = np.flatnonzero(on_thread & (ts > high))  # past the last step: ranges may end after it
        if len(later):
            result[later] = self._walk(point_rank[later], ts[later])
        return result

    def _walk(self, rank: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Row of the innermost range open at each time on the thread of each rank (one that has
        ranges; a time on the axis or after it), -1 if none."""
        result = np.full(len(ts), -1, "int64")
        point_axis = rank.astype("int64") * self.span + (np.minimum(ts, self.origin + self.span - 1) - self.origin)
        pos = np.searchsorted(self.sorted_axis, point_axis, side="right") - 1
        candidate = np.where(pos >= 0, self.order[np.maximum(pos, 0)], -1)
        candidate = np.where((candidate >= 0) & (self.range_rank[np.maximum(candidate, 0)] == rank), candidate, -1)
        # Ranges on one thread nest, so the innermost one open at t is the latest-starting range
        # still open at t: walk from that candidate outwards, one nesting level per round.
        live = np.flatnonzero(candidate >= 0)
        for _ in range(MAX_NVTX_DEPTH):
            if len(live) == 0:
                break
            inside = self.end[candidate[live]] > ts[live]
            result[live[inside]] = candidate[live[inside]]
            live = live[~inside]
            candidate[live] = self.parent[candidate[live]]
            live = live[candidate[live] >= 0]
        return result


def nesting_depth(ranges: pd.DataFrame) -> np.ndarray:
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


def parents(ranges: pd.DataFrame, order: np.ndarray, keys: np.ndarray, depth: np.ndarray) -> np.ndarray:
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
    thread_code = np.unique(keys, return_inverse=True)[1].astype("int64")
    deepest = int(depth.max()) + 1
    if (int(thread_code.max()) + 1) * deepest * n < 2**62:
        # (thread, depth, position) packed into one int64: a binary search on integers is ten times
        # faster than on a structured array (1e6 operator ranges: 0.6 s against 7 s)
        def packed(depths: np.ndarray) -> np.ndarray:
            return (thread_code * deepest + depths) * n + position
        table, probe = packed(depth)[levels], packed(depth - 1)
    else:  # more threads x depth x ranges than 62 bits hold
        table = np.empty(n, dtype=[("key", "int64"), ("depth", "int64"), ("position", "int64")])
        table["key"], table["depth"], table["position"] = keys[levels], depth[levels], position[levels]
        probe = np.empty(n, dtype=table.dtype)
        probe["key"], probe["depth"], probe["position"] = keys, depth - 1, position
    at = np.searchsorted(table, probe, side="left") - 1  # the last one up with a smaller position
    candidate = levels[np.maximum(at, 0)]
    found = (at >= 0) & (depth > 1) & (keys[candidate] == keys) & (depth[candidate] == depth - 1)
    parent[found] = candidate[found]
    return parent


def range_paths(ranges: pd.DataFrame, names: Optional[np.ndarray] = None) -> np.ndarray:
    """Each range's path: the names (`names`, one per range; else the ranges' own) of the ranges
    enclosing it and its own, outermost first, joined by " > "."""
    parent = ranges["parent"].to_numpy()
    names = ranges["name"].to_numpy(dtype=object) if names is None else names
    paths = names.copy()
    depth = ranges["depth"].to_numpy()
    # Build paths outermost first, one nesting level at a time, no deeper than MAX_NVTX_DEPTH:
    # 100k pushes never popped would otherwise build paths of quadratic length.
    for level in range(2, min(int(depth.max(initial=1)), MAX_NVTX_DEPTH) + 1):
        here = np.flatnonzero((depth == level) & (parent >= 0))
        paths[here] = paths[parent[here]] + " > " + names[here]
    return paths


def attribute_operators(points: pd.DataFrame, operator_ranges: pd.DataFrame) -> pd.Categorical:
    """Innermost PyTorch operator range open at each point on its own thread (columns pid, tid,
    ts_ns), "" where none is; "" is always category 0.

    Unlike user ranges, never looked up on the main thread: an autograd thread records the
    operators of the backward pass itself, and the main thread's operator at that moment is
    another one.
    """
    n = len(points)
    if n == 0 or operator_ranges.empty:
        return pd.Categorical.from_codes(np.zeros(n, "int8"), categories=[""])
    index = _innermost(points["pid"].to_numpy(), points["tid"].to_numpy(), points["ts_ns"].to_numpy(),
                       operator_ranges)
    codes, names = operator_codes(operator_ranges)
    return pd.Categorical.from_codes(np.where(index >= 0, codes[np.maximum(index, 0)], 0),
                                     categories=pd.Index(names, dtype=object))


def operator_codes(operator_ranges: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each operator range's code, and the names the codes index: "" (code 0, no operator) first,
    then the operators by first appearance."""
    codes, names = pd.factorize(operator_ranges["name"].to_numpy(dtype=object))
    return codes.astype("int64") + 1, np.append("", names).astype(object)
