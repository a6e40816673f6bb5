"""Live bytes over time: the running sum of each (process, device, kind), drawn as a step series."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..engine import Facts, Reducer
from ..events.nvtx import thread_key
from .capture import FINITE
from ..events.arrays import HIGH
from .grouping import Keyed
from .groups import batch_groups
from ..model import Band, Series

if TYPE_CHECKING:
    from ..events.batch import EventBatch

GROUP = ["pid", "device", "kind"]
MAX_POINTS = 2000  # per series: enough to draw, small enough to ship in JSON
MAX_BANDS = 300


class TimelineSeries(Reducer):
    """Step series per (process, device, kind), downsampled so that every peak survives: a group
    of more than MAX_POINTS events keeps, per bucket of its time span (MAX_POINTS / 2 of them),
    the first point at its highest and its last point, and its first point; a smaller one every
    point. The first look finds each group's span and events, the second keeps the points."""

    field = "timeline"  # its series
    second_look = True

    def start(self, facts: Facts) -> None:
        super().start(facts)
        # per group key, in order of first appearance: the times of its first and last events, its events
        self.groups = Keyed(("first_ts", "last_ts", "events"), {"first_ts": HIGH})

    def add(self, b: "EventBatch") -> None:
        if not len(b):
            return
        found = batch_groups(b)
        seg, g = found.segments, self.groups
        at = g.codes(found.keys)
        g["first_ts"][at] = np.minimum(g["first_ts"][at], b.ts[seg.order[seg.starts]])
        g["last_ts"][at] = seg.last(b.ts)
        g["events"][at] += seg.sizes

    def between(self) -> None:
        self.live = [0] * len(self.groups.index)
        self.points: list[list] = [[] for _ in self.groups.index]  # per group: (ts, live, bucket) of each batch

    def again(self, b: "EventBatch") -> None:
        if not len(b):
            return
        found = batch_groups(b)
        seg, buckets, g = found.segments, MAX_POINTS // 2, self.groups
        for key, a, n in zip(found.keys.tolist(), seg.starts.tolist(), seg.sizes.tolist()):  # one per group
            row = g.index[key]
            ts, live = b.ts[seg.order[a:a + n]], found.live[a:a + n]
            if self.live[row]:
                live = live + self.live[row]
            self.live[row] = int(live[-1])
            if g["events"][row] <= MAX_POINTS:
                self.points[row].append((ts, live, None))
                continue
            span = max(float(g["last_ts"][row] - g["first_ts"][row]), 1.0)
            bucket = ((ts - g["first_ts"][row]) / span * (buckets - 1)).astype("int64")  # ts sorted: so is bucket
            keep = np.unique(np.append(bucket_ends(live, bucket), 0))  # and the batch's first point
            self.points[row].append((ts[keep], live[keep], bucket[keep]))

    def finish(self, live: dict) -> list[Series]:
        kinds, series = self.facts.kinds, []
        for key, row in sorted(self.groups.index.items()):  # one per group, in key order
            parts = self.points[row]
            ts, values = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
            if parts[0][2] is not None:  # each batch's kept points: the same choice among them
                keep = np.unique(np.append(bucket_ends(values, np.concatenate([p[2] for p in parts])), 0))
                ts, values = ts[keep], values[keep]
            series.append(Series(int(key >> 24), int(((key >> 8) & 0xFFFF) - 1), str(kinds[key & 0xFF]), ts.tolist(),
                                 values.tolist()))
        return series


def bucket_ends(values: np.ndarray, bucket: np.ndarray) -> np.ndarray:
    """Of points (at least one) with their buckets, ascending: the positions of each bucket's
    first point at its highest value and of its last point (in no order; one twice where they
    are the same)."""
    starts = np.concatenate([[0], np.flatnonzero(np.diff(bucket)) + 1])
    sizes = np.diff(np.append(starts, len(bucket)))
    highest = np.maximum.reduceat(values, starts)
    at_highest = np.where(values == np.repeat(highest, sizes), np.arange(len(bucket)), len(bucket))
    return np.concatenate([np.minimum.reduceat(at_highest, starts), starts + sizes - 1])


def longest_per_process(ranges: pd.DataFrame, limit: int) -> pd.DataFrame:
    """The ranges, those left open ending at their start; at most `limit` of them, the longest,
    shared evenly among the processes (limit / processes each): one rank's many long ranges never
    leave the other GPUs of a 1e6-event capture without bands (all 300 went to one of its 4 ranks)."""
    ends = ranges["end_ns"].to_numpy()
    ranges = ranges.assign(end_ns=np.where(ends < FINITE, ends, ranges["start_ns"].to_numpy()))
    if len(ranges) <= limit:
        return ranges
    pids = ranges["pid"].to_numpy()
    quota = max(1, limit // len(pd.unique(pids)))
    length = pd.Series((ranges["end_ns"] - ranges["start_ns"]).to_numpy())
    rank = length.groupby(pids).rank(method="first", ascending=False).to_numpy()  # ties: the earlier row first
    return ranges[rank <= quota]


def top_level_bands(ranges: pd.DataFrame, threads: pd.DataFrame, limit: int = MAX_BANDS) -> list[Band]:
    """Outermost NVTX ranges of each process's main thread (e.g. "setup", "step 0", "step 1"), of
    the processes of `threads` (pid, tid: the threads with memory events; all processes when none).

    The main thread (tid == pid) carries the phases of a program; worker threads (PyTorch's
    autograd threads, for one) carry library ranges such as cub sorts. A process whose main
    thread has no ranges falls back to the threads that allocated.
    """
    top = ranges[ranges["depth"] == 1]
    if not threads.empty:  # distinct values by a hash pass: np.unique and np.isin sort all 1e7 events' keys
        top = top[top["pid"].isin(pd.unique(threads["pid"].to_numpy())).to_numpy()]
    on_main = (top["tid"] == top["pid"]).to_numpy()
    has_main = top.loc[on_main, "pid"].unique()
    keys = pd.unique(thread_key(threads["pid"].to_numpy(), threads["tid"].to_numpy()))
    by_allocator = np.isin(thread_key(top["pid"].to_numpy(), top["tid"].to_numpy()), keys)
    top = top[on_main | (~top["pid"].isin(has_main).to_numpy() & by_allocator)]
    top = longest_per_process(top, limit).sort_values("start_ns", kind="stable")  # then in time order
    return [Band(int(p), str(n), int(s), int(e))
            for p, n, s, e in top[["pid", "name", "start_ns", "end_ns"]].itertuples(index=False)]
