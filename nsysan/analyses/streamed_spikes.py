"""spikes.find_spikes over a flow of event batches, in bounded memory: what the streamed full
analysis adds to the spikes `--quick` streams (streamed_run._spike_watches, SecondLook._spikes).

The rises within the innermost NVTX range instances (spikes._range_rises) are running state per
instance: the first pass keeps, for each instance and each (process, device) series, the live
bytes just before its first event, its highest point so far (its first event at that height)
and the lowest point before it; after the pass, the same rises are ranked as the whole frame
ranks them (spikes._largest over the same array), and join the window rises as candidates. The
second pass sums, for each spike chosen, the bytes its growing allocations made per API and per
call site (and their NVTX range), from what the calls say of each allocation (SiteSums), and
notes the thread of the event at its top, whose NVTX path names the spike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..model import Holder, Spike
from .phases import innermost_ranges
from .spikes import CANDIDATES, MAX_PARTS, _largest
from .steps import OPEN_END
from .streamed import SPIKE_KINDS, pair_key

_LOW, _HIGH = np.iinfo("int64").min, np.iinfo("int64").max


@dataclass
class _Instances:
    """One series' view of its process's innermost range instances (in innermost_ranges' order)."""

    start: np.ndarray
    end: np.ndarray
    highest: np.ndarray  # live bytes at the highest event inside, _LOW while none
    high_seq: np.ndarray
    before: np.ndarray  # live bytes just before its first event at or after its start
    seen: np.ndarray  # whether that event has come
    run_low: np.ndarray  # the lowest `before` of its events so far, and the first event at it
    run_seq: np.ndarray
    low: np.ndarray  # the lowest `before` up to its highest event, and the first event at it
    low_seq: np.ndarray
    # the instances by start, the latest end among each one and those before, and how many (by
    # start) have seen their first event: a batch looks at the instances its times can reach only
    order: np.ndarray
    sorted_start: np.ndarray
    reach: np.ndarray
    unseen: int = 0

    @classmethod
    def of(cls, start: np.ndarray, end: np.ndarray) -> "_Instances":
        n = len(start)
        order = np.argsort(start, kind="stable")
        return cls(start, end, np.full(n, _LOW, "int64"), np.full(n, -1, "int64"), np.zeros(n, "int64"),
                   np.zeros(n, bool), np.full(n, _HIGH, "int64"), np.full(n, -1, "int64"),
                   np.full(n, _HIGH, "int64"), np.full(n, -1, "int64"), order, start[order],
                   np.maximum.accumulate(end[order]) if n else end)


class RangeRises:
    """The first pass's consumer: spikes._range_rises' state per series and range instance."""

    def __init__(self, ranges: pd.DataFrame, memory_threads: np.ndarray) -> None:
        # every closed innermost range on a memory thread; those ending at or after the capture's
        # end (known after the pass) are left out when ranking
        found = innermost_ranges(ranges, memory_threads, OPEN_END)
        self.by_pid: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if found:
            frame = pd.DataFrame(found, columns=["pid", "start", "end"])
            for pid, rows in frame.groupby("pid", sort=False):  # the processes with ranges
                self.by_pid[int(pid)] = (rows["start"].to_numpy().astype("int64"), rows["end"].to_numpy().astype("int64"))
        self.series: dict[int, _Instances] = {}
        self.live: dict[int, int] = {}  # pair key -> live bytes so far
        self.before_last: dict[int, int] = {}  # pair key -> live bytes before its latest event

    def add(self, b) -> None:
        rows = np.flatnonzero(np.isin(b.kind, SPIKE_KINDS))
        if not len(rows):
            return
        keys = pair_key(b.pid[rows], b.device[rows])
        for key in pd.unique(keys).tolist():  # a few (process, device) series
            mine = rows[keys == key]
            live = self.live.get(key, 0) + np.cumsum(b.delta[mine])
            before = live - b.delta[mine]
            self.live[key], self.before_last[key] = int(live[-1]), int(before[-1])
            pid = key >> 16
            if pid not in self.by_pid:
                continue
            if key not in self.series:
                self.series[key] = _Instances.of(*self.by_pid[pid])
            _rises(self.series[key], b.seq[mine], b.ts[mine], live, before)

    def candidates(self, key: int, end_ns: int) -> list[tuple[int, int, str, int, int]]:
        """spikes._range_rises of one series as (low seq, high seq, "range", live at the high,
        live before the low), once the pass is done; `end_ns`: the end of the capture."""
        s = self.series.get(key)
        if s is None:
            return []
        closed = s.end < min(OPEN_END, max(end_ns, 0))
        before = np.where(s.seen, s.before, self.before_last.get(key, 0))[closed]
        rise = s.highest[closed] - before  # as the whole frame computes it, wrapping included
        found = []
        for i in _largest(rise, CANDIDATES).tolist():  # the largest few only
            high, low = int(s.high_seq[closed][i]), int(s.low_seq[closed][i])
            if high >= 0 and int(s.highest[closed][i]) > int(s.low[closed][i]):
                found.append((low, high, "range", int(s.highest[closed][i]), int(s.low[closed][i])))
        return found


def _rises(s: _Instances, seq: np.ndarray, ts: np.ndarray, live: np.ndarray, before: np.ndarray) -> None:
    """One batch of a series into its instances' state."""
    begun = int(np.searchsorted(s.sorted_start, ts[-1], side="right"))
    # the instances starting after the series' earlier batches and by this one's end: their first event is here
    starting = s.order[s.unseen:begun]
    s.before[starting] = before[np.searchsorted(ts, s.start[starting], side="left")]
    s.seen[starting], s.unseen = True, max(s.unseen, begun)
    reached = s.order[int(np.searchsorted(s.reach, ts[0], side="left")):begun]  # not ended before it
    first = np.searchsorted(ts, s.start[reached], side="left")
    stop = np.searchsorted(ts, s.end[reached], side="right")
    hold = stop > first
    inside, first, stop = reached[hold], first[hold], stop[hold]
    if not len(inside):
        return
    # (instance, position) of every event inside an instance, instance by instance: the batch's
    # events, once more for each instance of another thread that overlaps
    lengths = stop - first
    bounds = np.cumsum(lengths) - lengths  # where each instance's events begin
    total = int(lengths.sum())
    index = np.arange(total)
    position = index - np.repeat(bounds, lengths) + np.repeat(first, lengths)
    high, low = live[position], before[position]
    # each instance's highest event here (the first of equals), and whether it beats the carried one
    top_value = np.maximum.reduceat(high, bounds)
    top = position[np.minimum.reduceat(np.where(high == np.repeat(top_value, lengths), index, total), bounds)]
    raised = top_value > s.highest[inside]
    # the lowest `before` up to a new highest event: the carried one unless this batch's is lower
    upto = position <= np.repeat(np.where(raised, top, -1), lengths)
    masked = np.where(upto, low, _HIGH)
    low_value = np.minimum.reduceat(masked, bounds)
    low_at = np.minimum(np.minimum.reduceat(np.where(upto & (masked == np.repeat(low_value, lengths)), index, total),
                                            bounds), total - 1)
    lower = low_value < s.run_low[inside]
    new_low = np.where(lower, low_value, s.run_low[inside])
    new_seq = np.where(lower, seq[position[low_at]], s.run_seq[inside])
    up = inside[raised]
    s.highest[up], s.high_seq[up] = top_value[raised], seq[top[raised]]
    s.low[up], s.low_seq[up] = new_low[raised], new_seq[raised]
    # the running lowest over every event of the instance so far
    run_value = np.minimum.reduceat(low, bounds)
    run_at = np.minimum.reduceat(np.where(low == np.repeat(run_value, lengths), index, total), bounds)
    lower = run_value < s.run_low[inside]
    s.run_low[inside[lower]], s.run_seq[inside[lower]] = run_value[lower], seq[position[run_at[lower]]]


@dataclass
class _Parts:
    """What grew inside one spike: bytes per API code, and per site code [bytes, allocations,
    first NVTX range code, whether its allocations had several]."""

    apis: dict = field(default_factory=dict)
    sites: dict = field(default_factory=dict)
    top: Optional[tuple[int, int, int]] = None  # (pid, tid, ts) of the event at the spike's top


class SpikeParts:
    """The second pass's consumer: the parts of each spike of `look` (SecondLook, its `spikes`);
    a watcher of `sites` (SiteSums), fed each batch with what it knows of the allocations."""

    def __init__(self, look, sites) -> None:
        self.look, self.sites = look, sites
        keys = {code: key for key, code in look.first.spike_series.index.items()}
        self.watched = [(w, keys[w.series]) for w in look.spikes]
        self.parts = {id(w): _Parts() for w in look.spikes}
        sites.watchers.append(self)

    def add(self, b, known: dict) -> None:
        if len(b) == 0:
            return
        first, last = int(b.seq[0]), int(b.seq[-1])
        if not any(w.low <= last and w.high >= first for w, _ in self.watched):  # most batches hold no spike
            return
        rows = np.flatnonzero(np.isin(b.kind, SPIKE_KINDS))
        keys = pair_key(b.pid[rows], b.device[rows])
        api = self.sites._api_codes(b)
        for watch, key in self.watched:  # a few per series
            mine = rows[(keys == key) & (b.seq[rows] >= watch.low) & (b.seq[rows] <= watch.high)]
            if not len(mine):
                continue
            parts = self.parts[id(watch)]
            top = mine[b.seq[mine] == watch.high]
            if len(top):
                parts.top = (int(b.pid[top[0]]), int(b.calls["tid"][top[0]]), int(b.ts[top[0]]))
            grown = mine[b.delta[mine] > 0]
            if not len(grown):
                continue
            at = np.searchsorted(known["seq"], b.seq[grown])
            size = b.bytes[grown]
            codes, slot = np.unique(api[grown], return_inverse=True)
            totals = np.zeros(len(codes), "int64")
            np.add.at(totals, slot, size)
            for code, total in zip(codes.tolist(), totals.tolist()):  # a few APIs
                parts.apis[code] = parts.apis.get(code, 0) + total
            # per site (peak.made_of): bytes, allocations, its first one's NVTX range, and whether it had several
            site, name = known["site"][at], known["nvtx_range"][at]
            present, first, slot = np.unique(site, return_index=True, return_inverse=True)
            totals, counts = np.zeros(len(present), "int64"), np.bincount(slot, minlength=len(present))
            np.add.at(totals, slot, size)
            names = np.bincount(np.unique(slot.astype("int64") << 32 | name) >> 32, minlength=len(present))
            for code, total, count, first_name, several in zip(present.tolist(), totals.tolist(), counts.tolist(),
                                                               name[first].tolist(), (names > 1).tolist()):
                entry = parts.sites.setdefault(code, [0, 0, first_name, False])
                entry[0] += total
                entry[1] += count
                entry[3] = entry[3] or several or first_name != entry[2]

    def spikes(self, gpu_of, path_of: Callable[[int, int, int], str]) -> list[Spike]:
        """find_spikes' list: the quick one's (SecondLook's watches) with NVTX paths, APIs and sites."""
        sites = self.sites
        order = {label: i for i, label in enumerate(sites.whole_frame_labels())}
        labels = list(sites.labels)
        strings = list(sites.strings)
        found = []
        for watch, key in self.watched:
            pid, device = key >> 16, (key & 0xFFFF) - 0x10000 if key & 0x8000 else key & 0xFFFF
            parts = self.parts[id(watch)]
            apis = sorted(parts.apis.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_PARTS]
            ranked = sorted(parts.sites.items(), key=lambda kv: (-kv[1][0], order[labels[kv[0]]]))[:MAX_PARTS]
            found.append(Spike(
                pid=pid, device=device, gpu=gpu_of(pid, device), found_by=watch.how, start_ns=watch.start_ns,
                peak_ns=watch.peak_ns, rise_bytes=watch.peak_level - watch.start_level,
                start_live_bytes=watch.start_level, peak_live_bytes=watch.peak_level,
                nvtx_path=path_of(*parts.top) if parts.top else "",
                apis=[sites.api_names[code] for code, _ in apis],
                sites=[Holder(site=labels[code], nvtx_range=strings[name] if not several else "", bytes=int(total),
                              allocations=int(count)) for code, (total, count, name, several) in ranked],
                freed_after_bytes=int(min(watch.peak_level - watch.lowest_after, watch.peak_level - watch.start_level)),
                given_back_ns=watch.given_back_ns))
        return found
