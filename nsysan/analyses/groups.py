"""Totals per (process, device, kind) group: peak and when it was reached, end value, counts,
never freed, frees without their allocation (`Analysis.groups`). One reducer (nsysan/engine)
for the whole frame and the streamed flow alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np
import pandas as pd

from ..engine import Reducer
from ..model import GroupSummary
from ..events.arrays import LOW
from .grouping import Keyed, Segments

if TYPE_CHECKING:
    from ..events.batch import EventBatch

# The sums carried from batch to batch, one int64 per group each.
SUMS = ("live", "peak", "peak_ts", "events", "allocations", "allocated", "orphans", "orphan_bytes",
        "never_freed_count", "never_freed_bytes")


@dataclass
class BatchGroups:
    """A batch's events brought together by (process, device, kind): `keys` (group_key of each
    group, ascending), `segments` (their rows, each group's in time order) and `live` (each
    group's running sum of delta bytes over the batch, from 0, in segment order)."""

    keys: np.ndarray
    segments: Segments
    live: np.ndarray

    def members(self, group: int) -> tuple[np.ndarray, np.ndarray]:
        """The rows of the group numbered `group` (in time order) and their running sums."""
        start = int(self.segments.starts[group])
        stop = start + int(self.segments.sizes[group])
        return self.segments.order[start:stop], self.live[start:stop]


def group_key(pid: np.ndarray, device: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """(pid, device, kind code) packed in one int64 (pid 24 bits up, device + 1 in 16, the kind in
    8): ascending keys are the groups' order. Built in place: each full-length temporary is 80 MB
    at 1e7 events, and the whole frame's are made while the peaks are found on the other core (the
    analyses' highest memory)."""
    packed = np.asarray(pid).astype("int64")
    packed <<= 24
    device = np.asarray(device).astype("int64")
    device += 1
    device <<= 8
    packed |= device
    del device
    packed |= np.asarray(kind).astype("int64", copy=False)
    return packed


def group_parts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pid, device, kind code) of each key that group_key packed."""
    return keys >> 24, ((keys >> 8) & 0xFFFF) - 1, keys & 0xFF


def batch_groups(b: "EventBatch") -> BatchGroups:
    """The batch's groups, made once for every reducer that reads them (the whole frame's once for
    every engine run over it)."""
    made = b.shared.get("groups")
    if made is None:
        codes, keys = pd.factorize(group_key(b.pid, b.device, b.kind), sort=True)
        segments = Segments(codes.astype("int64", copy=False), len(keys))
        made = b.shared["groups"] = BatchGroups(np.asarray(keys, "int64"), segments,
                                                segments.running_sums(b.delta))
    return made


def batch_series(b: "EventBatch", kinds: list[int], per_device: bool = True) \
        -> list[tuple[tuple[int, Optional[int]], np.ndarray, np.ndarray]]:
    """Each (process, device) series of the batch's events of `kinds` (codes), in (pid, device)
    order (`per_device` false: each process's, its devices together, keyed (pid, None)): its
    rows, in time order, and its running live bytes over the batch from 0 (several kinds or
    devices together: merged in event order, summed again). Made once per batch for every
    reducer that reads them."""
    made = b.shared.setdefault("series", {})
    if (tuple(kinds), per_device) not in made:
        found = batch_groups(b) if len(b) else None
        key = found.keys if found is not None else np.zeros(0, "int64")
        pid, device, kind = group_parts(key)
        if not per_device:
            device = np.zeros(len(key), "int64")  # one for all
        chosen = np.flatnonzero(np.isin(kind, kinds))
        series = []
        for p, d in sorted({(int(pid[g]), int(device[g])) for g in chosen.tolist()}):  # a few series
            parts = [found.members(g) for g in chosen[(pid[chosen] == p) & (device[chosen] == d)].tolist()]
            if len(parts) == 1:
                rows, live = parts[0]
            else:
                rows = np.sort(np.concatenate([rows for rows, _ in parts]), kind="stable")
                live = np.cumsum(b.delta[rows])
            series.append(((p, d if per_device else None), rows, live))
        made[(tuple(kinds), per_device)] = series
    return made[(tuple(kinds), per_device)]


class GroupSums(Reducer):
    """The groups' totals, summed batch by batch. A group's peak is the highest of its running
    live bytes, and its time the first event that reached it (the events come in time order)."""

    field = "groups"

    def start(self, facts) -> None:
        super().start(facts)
        self.sums = Keyed(SUMS, {"peak": LOW})  # per group key, in order of first appearance

    def add(self, b: "EventBatch") -> None:
        if len(b):
            self._events(b)
        closed = b.closed
        if len(closed.get("seq", ())):  # never to be freed any more: never freed
            self._never_freed(closed)

    def _events(self, b: "EventBatch") -> None:
        found = batch_groups(b)
        seg, s = found.segments, self.sums
        at = s.codes(found.keys)
        is_alloc = seg.in_group_order(b.is_alloc)
        orphan = seg.in_group_order(b.partner_seq < 0)
        orphan &= ~is_alloc  # a free of no allocation seen
        sizes = seg.in_group_order(b.bytes)
        s["events"][at] += seg.count()
        s["allocations"][at] += seg.count(is_alloc, ordered=True)
        s["allocated"][at] += seg.sum(np.where(is_alloc, sizes, 0), ordered=True)
        s["orphans"][at] += seg.count(orphan, ordered=True)
        s["orphan_bytes"][at] += seg.sum(np.where(orphan, sizes, 0), ordered=True)
        del is_alloc, orphan, sizes
        highest = seg.max(found.live, ordered=True) + s["live"][at]
        better = highest > s["peak"][at]
        if better.any():
            first = seg.first_row_of_max(found.live, ordered=True)
            s["peak"][at[better]] = highest[better]
            s["peak_ts"][at[better]] = b.ts[first[better]]
        s["live"][at] += seg.last(found.live, ordered=True)

    def _never_freed(self, allocations: dict) -> None:
        at = self.sums.codes(group_key(allocations["pid"], allocations["device"], allocations["kind"]))
        np.add.at(self.sums["never_freed_count"], at, 1)
        np.add.at(self.sums["never_freed_bytes"], at, allocations["bytes"].astype("int64"))

    def finish(self, live: dict) -> list[GroupSummary]:
        """One summary per group, in key order; the allocations `live` at the end never freed."""
        if len(live["seq"]):
            self._never_freed(live)
        s, kinds, gpu_of = self.sums, self.facts.kinds, self.facts.gpu_of
        summaries = []
        for key, row in sorted(s.index.items()):  # one per group
            pid, device, code = group_parts(key)
            kind = str(kinds[code])
            peak = int(max(int(s["peak"][row]), 0))
            allocations = int(s["allocations"][row])
            summaries.append(GroupSummary(
                pid=int(pid), device=int(device), kind=kind, gpu=gpu_of(int(pid), int(device)), peak_bytes=peak,
                peak_time_ns=int(s["peak_ts"][row]) if peak > 0 else None, end_bytes=int(s["live"][row]),
                allocations=allocations, frees=int(s["events"][row]) - allocations,
                allocated_bytes=int(s["allocated"][row]), never_freed_bytes=int(s["never_freed_bytes"][row]),
                never_freed_count=int(s["never_freed_count"][row]), frees_without_alloc=int(s["orphans"][row]),
                frees_without_alloc_bytes=int(s["orphan_bytes"][row])))
        return summaries

