"""Live bytes over time: the running sum of each (process, device, kind), drawn as a step series."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from ..events.nvtx import thread_key
from .grouping import Segments
from ..model import Band, Series, Timeline

GROUP = ["pid", "device", "kind"]
MAX_POINTS = 2000  # per series: enough to draw, small enough to ship in JSON
MAX_BANDS = 300


@dataclass(frozen=True)
class Groups:
    """The (process, device, kind) groups and each group's live bytes after each of its events."""

    keys: pd.DataFrame  # one row per group: pid, device, kind (str)
    # live bytes of the group right after each event, in segment order: group g's events are rows
    # segments.order[a:b] and their live bytes live[a:b], a = segments.starts[g], b = a + sizes[g]
    live: Optional[np.ndarray]
    segments: Optional["Segments"] = None  # the events sorted by group, for per-group sums

    def rows(self, kinds: Sequence[str], pid: Optional[int] = None, device: Optional[int] = None) -> np.ndarray:
        """The rows of the events of these kinds (of one process, of one device), in time order:
        one sort of the events into groups serves every analysis that looks at one process or GPU
        (each built its own full-length masks and row lists per process before)."""
        if self.segments is None:
            return np.zeros(0, "int64")
        chosen = self._of_process[pid] if pid is not None else np.arange(len(self.keys))
        chosen = chosen[self._of_kinds(tuple(kinds))[chosen]]
        if device is not None:
            chosen = chosen[self.keys["device"].to_numpy()[chosen] == device]
        order, starts, sizes = self.segments.order, self.segments.starts, self.segments.sizes
        parts = [order[start:start + size] for start, size in zip(starts[chosen].tolist(), sizes[chosen].tolist())]
        if len(parts) <= 1:
            return parts[0] if parts else np.zeros(0, "int64")
        return np.sort(np.concatenate(parts), kind="stable")  # a merge of sorted runs

    @cached_property
    def _of_process(self) -> dict[int, np.ndarray]:
        """Each process's group numbers, ascending: with thousands of processes, each asking for
        its rows scanned every group's keys (10,000 calls, 11 s at 5,000 processes)."""
        pids = self.keys["pid"].to_numpy()
        order = np.argsort(pids, kind="stable")
        bounds = np.flatnonzero(np.diff(pids[order])) + 1
        return defaultdict(lambda: np.zeros(0, "int64"),
                           {int(pids[part[0]]): part for part in np.split(order, bounds) if len(part)})

    def _of_kinds(self, kinds: tuple[str, ...]) -> np.ndarray:
        """Which groups hold one of `kinds` (a mask over the groups), worked out once per set of kinds."""
        masks = self.__dict__.setdefault("_kind_masks", {})
        if kinds not in masks:
            masks[kinds] = self.keys["kind"].isin(list(kinds)).to_numpy()
        return masks[kinds]

    def without_live(self) -> "Groups":
        """The grouping alone, for the analyses after the timeline and steps (80 MB less at 1e7 events)."""
        return dataclasses.replace(self, live=None)

    def members(self, group: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows of one group's events (in time order) and its live bytes after each."""
        start = int(self.segments.starts[group])
        stop = start + int(self.segments.sizes[group])
        return self.segments.order[start:stop], self.live[start:stop]


def group_events(events: pd.DataFrame) -> Groups:
    """Number the (process, device, kind) groups and run their live-bytes sums (one pass each)."""
    if events.empty:
        empty = pd.DataFrame({"pid": pd.Series(dtype="int64"), "device": pd.Series(dtype="int64"),
                              "kind": pd.Series(dtype="object")})
        return Groups(empty, np.zeros(0, "int64"), None)
    # pid has 24 bits, device 16 and a kind code 8: one int64 key per event, factorized once.
    # Built in place, and the codes shared: each full-length temporary is 80 MB at 1e7 events,
    # and this runs while the peaks are found on the other core (the analyses' highest memory).
    packed = events["pid"].to_numpy().astype("int64")
    packed <<= 24
    device = events["device"].to_numpy().astype("int64")
    device += 1
    device <<= 8
    packed |= device
    del device
    packed |= events["kind"].cat.codes.to_numpy()
    codes, uniques = pd.factorize(packed, sort=True)
    del packed
    codes = codes.astype("int64", copy=False)
    kinds = events["kind"].cat.categories
    keys = pd.DataFrame({"pid": uniques >> 24, "device": ((uniques >> 8) & 0xFFFF) - 1,
                         "kind": [str(kinds[k]) for k in uniques & 0xFF]})
    segments = Segments(codes, len(keys))
    del codes  # the segments hold the grouping: 80 MB less through every analysis after this one
    return Groups(keys, segments.running_sums(events["delta_bytes"].to_numpy()), segments)


def build_timeline(events: pd.DataFrame, groups: Groups, ranges: pd.DataFrame, start_ns: int, end_ns: int,
                   max_points: int = MAX_POINTS) -> Timeline:
    """Step series per (process, device, kind), downsampled so that every peak survives."""
    series = []
    if not events.empty:
        ts_all = events["ts_ns"].to_numpy()
        for g, (pid, device, kind) in enumerate(groups.keys.itertuples(index=False)):  # one per series
            rows, live = groups.members(g)  # this group's events, in time order
            ts, live = _downsample(ts_all[rows], live, max_points)
            series.append(Series(int(pid), int(device), str(kind), ts.tolist(), live.tolist()))
    return Timeline(start_ns=int(start_ns), end_ns=int(end_ns), series=series, bands=top_level_bands(ranges, events))


def _downsample(ts: np.ndarray, live: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Keep, per time bucket, the highest point and the last one, so peaks and levels survive."""
    if len(ts) <= max_points:
        return ts, live
    buckets = max(1, max_points // 2)
    span = max(float(ts[-1] - ts[0]), 1.0)
    bucket = ((ts - ts[0]) / span * (buckets - 1)).astype("int64")  # ts is sorted: so is bucket
    starts = np.concatenate([[0], np.flatnonzero(np.diff(bucket)) + 1])
    sizes = np.diff(np.append(starts, len(ts)))
    highest = np.maximum.reduceat(live, starts)
    positions = np.arange(len(ts))
    at_highest = np.where(live == np.repeat(highest, sizes), positions, len(ts))
    first_highest = np.minimum.reduceat(at_highest, starts)
    last = starts + sizes - 1
    keep = np.unique(np.concatenate([first_highest, last, [0]]))
    return ts[keep], live[keep]


def top_level_bands(ranges: pd.DataFrame, events: pd.DataFrame, limit: int = MAX_BANDS) -> list[Band]:
    """Outermost NVTX ranges of each process's main thread (e.g. "setup", "step 0", "step 1").

    The main thread (tid == pid) carries the phases of a program; worker threads (PyTorch's
    autograd threads, for one) carry library ranges such as cub sorts. A process whose main
    thread has no ranges falls back to the threads that allocated.
    """
    if ranges.empty:
        return []
    top = ranges[ranges["depth"] == 1]
    # distinct values by a hash pass: np.unique and np.isin sort all 1e7 events' keys
    pids = pd.unique(events["pid"].to_numpy()) if not events.empty else np.unique(top["pid"].to_numpy())
    top = top[top["pid"].isin(pids).to_numpy()]
    on_main = (top["tid"] == top["pid"]).to_numpy()
    has_main = top.loc[on_main, "pid"].unique()
    if events.empty:
        by_allocator = np.zeros(len(top), bool)
    else:
        threads = pd.unique(thread_key(events["pid"].to_numpy(), events["tid"].to_numpy()))
        by_allocator = np.isin(thread_key(top["pid"].to_numpy(), top["tid"].to_numpy()), threads)
    top = top[on_main | (~top["pid"].isin(has_main).to_numpy() & by_allocator)]
    end_cap = top["end_ns"].where(top["end_ns"] < np.iinfo("int64").max // 4, top["start_ns"])
    top = top.assign(end_ns=end_cap)
    if len(top) > limit:  # keep the longest, then show them in time order
        top = top.assign(length=top["end_ns"] - top["start_ns"]).nlargest(limit, "length")
    top = top.sort_values("start_ns", kind="stable")
    return [Band(int(p), str(n), int(s), int(e))
            for p, n, s, e in top[["pid", "name", "start_ns", "end_ns"]].itertuples(index=False)]
