"""Spikes: where live memory suddenly soared, without scrolling a timeline.

A spike is a rise of a (process, device)'s live device + array bytes from a low point to a high
point, found two ways: within a short window (default 10 ms, `--spike-window`), on two grids of
that width offset by half of it, so that any rise completed within half a window lies whole in
one cell; and within one innermost NVTX range instance. The largest rises per process and device
are kept, overlapping ones once, each with its time, size, the calls, sites and NVTX path that
made it, and whether (and when) live bytes fell back to where the rise began.

One reducer (`Spikes`, nsysan/engine) on the whole frame and the streamed flow alike. The first
look keeps, per series, the lowest point of each grid's open cell and its CANDIDATES largest
rises so far, and per innermost range instance its highest event, the lowest point before it and
the live bytes just before its first event; between the looks the candidates are ranked and the
overlapping ones dropped; the second look measures the chosen spikes: what their growing
allocations were (per API, per site: the batch's labelled calls, engine.Labels), when live bytes
came back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..engine import Reducer
from ..model import Holder, Spike
from .groups import batch_series
from .phases import innermost_ranges
from .steps import OPEN_END, STEP_KINDS

DEFAULT_WINDOW_NS = 10_000_000
TOP = 5  # per process and device
MAX_PARTS = 3  # APIs and sites named per spike
CANDIDATES = 64  # rises looked at per way of finding them: more than TOP, as overlapping ones are dropped
SLICE_ROWS = 1 << 18  # the whole frame's series fed a slice at a time: bounded temporaries
_LOW, _HIGH = np.iinfo("int64").min, np.iinfo("int64").max


class Spikes(Reducer):
    """`Analysis.spikes`. Facts: `spike_window_ns`; `nvtx_ranges` and `memory_threads` (the
    innermost closed range instances on memory threads are measured too; none when absent);
    `end_ns`, the capture's end as known before the events (a range ending at or after the later
    of it and the last event never closed); `labels`, a callable giving the engine.Labels of the
    batches' labelled calls once the second look is done."""

    field = "spikes"
    needs = ("spike_window_ns", "nvtx_ranges", "memory_threads", "end_ns", "labels")
    second_look = True

    def start(self, facts) -> None:
        super().start(facts)
        more = facts.more
        self.window_ns = max(int(more.get("spike_window_ns", DEFAULT_WINDOW_NS)), 1)
        self.kinds = [i for i, name in enumerate(facts.kinds) if name in STEP_KINDS]
        ranges = more.get("nvtx_ranges")
        found = innermost_ranges(ranges, more["memory_threads"], OPEN_END) if ranges is not None else []
        self.ranges: dict[int, tuple[list, list]] = {}  # pid -> its instances' starts and ends
        for pid, start, end in found:
            starts, ends = self.ranges.setdefault(int(pid), ([], []))
            starts.append(start)
            ends.append(end)
        self.series: dict[tuple[int, int], _Series] = {}
        self.last_ts = _LOW
        self.watches: dict[tuple[int, int], list[_Watch]] = {}
        self.carry: dict[tuple[int, int], int] = {}  # the second look's live bytes so far

    def add(self, b) -> None:
        if len(b):
            self.last_ts = max(self.last_ts, int(b.ts[-1]))
        for key, rows, live in batch_series(b, self.kinds):
            s = self.series.get(key)
            if s is None:
                s = self.series[key] = _Series(self.window_ns, self.ranges.get(key[0]))
            carried = s.live
            for a in range(0, len(rows), SLICE_ROWS):
                part = rows[a:a + SLICE_ROWS]
                s.add(b.seq[part], b.ts[part], live[a:a + SLICE_ROWS] + carried, b.delta[part])

    def between(self) -> None:
        end = max(int(self.facts.more.get("end_ns", 0)), self.last_ts if self.last_ts < OPEN_END else 0)
        self.carry = {}  # (a second look that starts over starts from 0)
        for key in sorted(self.series):
            s = self.series[key]
            live, before = {}, {}
            candidates = []
            for low, high, how, live_high, low_value in s.candidates(end):
                live[high], before[low] = live_high, low_value
                candidates.append((low, high, how))
            self.watches[key] = [_Watch(low, high, how, before[low], live[high])
                                 for low, high, how in _distinct(candidates, live, before, TOP)]

    def again(self, b) -> None:
        for key, rows, live in batch_series(b, self.kinds):
            watches = self.watches.get(key)
            if not watches:
                continue
            live = live + self.carry.get(key, 0)
            self.carry[key] = int(live[-1])
            seq = b.seq[rows]
            for watch in watches:  # a few per series
                watch.measure(b, rows, seq, live)

    def finish(self, live: dict) -> list[Spike]:
        labels = self.facts.more["labels"]()
        found = []
        for (pid, device), watches in sorted(self.watches.items()):
            for w in watches:
                apis = sorted(w.apis.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_PARTS]
                sites = sorted(w.sites.items(), key=lambda kv: (-kv[1][0], labels.site_rank(kv[0])))[:MAX_PARTS]
                found.append(Spike(
                    pid=pid, device=device, gpu=self.facts.gpu_of(pid, device), found_by=w.how,
                    start_ns=w.start_ns, peak_ns=w.peak_ns, rise_bytes=w.peak_level - w.start_level,
                    start_live_bytes=w.start_level, peak_live_bytes=w.peak_level,
                    nvtx_path=labels.path(*w.top) if w.top else "",
                    apis=[labels.apis[code] for code, _ in apis if code >= 0],
                    sites=[Holder(site=labels.sites[code] if code >= 0 else "",
                                  nvtx_range=labels.ranges[name] if name >= 0 and not several else "",
                                  bytes=int(total), allocations=int(count))
                           for code, (total, count, name, several) in sites],
                    freed_after_bytes=int(min(w.peak_level - w.lowest_after, w.peak_level - w.start_level)),
                    given_back_ns=w.given_back_ns))
        return found


@dataclass
class _Grid:
    """One series' rises within one grid of windows: the open cell and its lowest point, and the
    largest rises so far as (rise, high seq, low seq, live at the high, live before the low)."""

    offset: int
    cell: Optional[int] = None
    low_value: int = 0
    low_seq: int = -1
    best: list = field(default_factory=list)

    def add(self, seq: np.ndarray, ts: np.ndarray, live: np.ndarray, before: np.ndarray, window_ns: int) -> None:
        cell = (ts + self.offset) // window_ns
        # the lowest `before` so far in each row's cell, and where it was first reached
        starts = np.flatnonzero(np.concatenate([[True], cell[1:] != cell[:-1]]))
        lows = before.copy()
        carried = self.cell is not None and cell[0] == self.cell and self.low_value <= before[0]
        if carried:  # the open cell's lowest point, from an earlier batch
            lows[0] = self.low_value
        run_low = _running_min_per_cell(lows, cell, starts)
        # the first position of each running minimum: where it last dropped (or its cell began)
        dropped = np.zeros(len(lows), bool)
        dropped[starts] = True
        dropped[1:] |= run_low[1:] < run_low[:-1]
        drops = np.flatnonzero(dropped)
        rise = live - run_low
        # once CANDIDATES are kept, a row rising no further than the least of them ranks after it
        # (its seq is later): only the rows rising further are ranked
        top = _top_rises(rise, seq, self.best[-1][0] if len(self.best) == CANDIDATES else None)
        # the seq of the low point of each top row's rise, and of the last row's (one search for all)
        at = drops[np.searchsorted(drops, np.append(top, len(seq) - 1), side="right") - 1]
        low_seq = np.where(at == 0, self.low_seq, seq[at]) if carried else seq[at]
        found = list(zip(rise[top].tolist(), seq[top].tolist(), low_seq[:-1].tolist(), live[top].tolist(),
                         run_low[top].tolist()))
        self.best = sorted(self.best + found, key=lambda c: (-c[0], c[1]))[:CANDIDATES]
        self.cell, self.low_value, self.low_seq = int(cell[-1]), int(run_low[-1]), int(low_seq[-1])


def _top_rises(rise: np.ndarray, seq: np.ndarray, floor: Optional[int] = None) -> np.ndarray:
    """The CANDIDATES rows of the largest rise, then earliest: the first of a lexsort of (-rise,
    seq), sorting only the rows that rise at least as far as the CANDIDATES-th largest (a full
    sort of every row of the batch cost 2 of the streamed full analysis's CPU s at 1e7); only
    of the rows rising further than `floor`, when given (at 1e7 events, a few rows of a batch)."""
    if floor is not None:
        pool = np.flatnonzero(rise > floor)
        if len(pool) <= CANDIDATES:
            return pool[np.lexsort((seq[pool], -rise[pool]))]
        return pool[_top_rises(rise[pool], seq[pool])]
    if len(rise) > CANDIDATES:
        kth = np.partition(rise, len(rise) - CANDIDATES)[len(rise) - CANDIDATES]
        pool = np.flatnonzero(rise >= kth)
        return pool[np.lexsort((seq[pool], -rise[pool]))[:CANDIDATES]]
    return np.lexsort((seq, -rise))[:CANDIDATES]


def _running_min_per_cell(values: np.ndarray, cell: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The running minimum of `values`, restarting where each cell starts (`starts`; `cell`: each
    row's, ascending): each cell shifted down by more than the values' whole range, one accumulate
    does every cell; numbered without gaps when the cells' own numbers would overflow the shift,
    and cell by cell when even that would."""
    spread = int(values.max()) - int(values.min()) + 1
    steps = cell - cell[0]
    if spread * (int(steps[-1]) + 1) >= 2**62:
        steps = np.zeros(len(values), "int64")
        steps[starts] = 1
        steps = np.cumsum(steps) - 1  # the cell's number in the batch
    if spread * (int(steps[-1]) + 1) < 2**62:
        steps *= spread
        low = values - steps
        np.minimum.accumulate(low, out=low)
        low += steps
        return low
    low = np.empty_like(values)
    for a, z in zip(starts.tolist(), np.append(starts[1:], len(values)).tolist()):  # one per cell
        low[a:z] = np.minimum.accumulate(values[a:z])
    return low


class _Instances:
    """One series' view of its process's innermost range instances (in innermost_ranges' order)."""

    def __init__(self, start: list, end: list) -> None:
        n = len(start)
        self.start, self.end = np.array(start, "int64"), np.array(end, "int64")
        self.highest, self.high_seq = np.full(n, _LOW, "int64"), np.full(n, -1, "int64")  # the highest event inside
        self.before, self.seen = np.zeros(n, "int64"), np.zeros(n, bool)  # live just before its first event
        # the lowest `before` of its events so far, and the first event at it; the same up to its highest event
        self.run_low, self.run_seq = np.full(n, _HIGH, "int64"), np.full(n, -1, "int64")
        self.low, self.low_seq = np.full(n, _HIGH, "int64"), np.full(n, -1, "int64")
        # the instances by start, the latest end among each one and those before, and how many (by
        # start) have seen their first event: a batch looks at the instances its times can reach only
        self.order = np.argsort(self.start, kind="stable")
        self.sorted_start = self.start[self.order]
        self.reach = np.maximum.accumulate(self.end[self.order]) if n else self.end
        self.unseen = 0

    def add(self, seq: np.ndarray, ts: np.ndarray, live: np.ndarray, before: np.ndarray) -> None:
        begun = int(np.searchsorted(self.sorted_start, ts[-1], side="right"))
        # the instances starting after the series' earlier events and by these ones' end: their first event is here
        starting = self.order[self.unseen:begun]
        self.before[starting] = before[np.searchsorted(ts, self.start[starting], side="left")]
        self.seen[starting], self.unseen = True, max(self.unseen, begun)
        reached = self.order[int(np.searchsorted(self.reach, ts[0], side="left")):begun]  # not ended before
        first = np.searchsorted(ts, self.start[reached], side="left")
        stop = np.searchsorted(ts, self.end[reached], side="right")
        hold = stop > first
        inside, first, stop = reached[hold], first[hold], stop[hold]
        if not len(inside):
            return
        # (instance, position) of every event inside an instance, instance by instance: the events,
        # once more for each instance of another thread that overlaps
        lengths = stop - first
        bounds = np.cumsum(lengths) - lengths  # where each instance's events begin
        total = int(lengths.sum())
        index = np.arange(total)
        position = index + np.repeat(first - bounds, lengths)
        high, low = live[position], before[position]
        # each instance's highest event here (the first of equals), and whether it beats the carried one
        top_value = np.maximum.reduceat(high, bounds)
        top = position[np.minimum.reduceat(np.where(high == np.repeat(top_value, lengths), index, total), bounds)]
        raised = top_value > self.highest[inside]
        # the lowest `before` up to a new highest event: the carried one unless these events' is lower
        upto = position <= np.repeat(np.where(raised, top, -1), lengths)
        masked = np.where(upto, low, _HIGH)
        low_value = np.minimum.reduceat(masked, bounds)
        low_at = np.minimum(np.minimum.reduceat(np.where(upto & (masked == np.repeat(low_value, lengths)), index,
                                                         total), bounds), total - 1)
        lower = low_value < self.run_low[inside]
        new_low = np.where(lower, low_value, self.run_low[inside])
        new_seq = np.where(lower, seq[position[low_at]], self.run_seq[inside])
        up = inside[raised]
        self.highest[up], self.high_seq[up] = top_value[raised], seq[top[raised]]
        self.low[up], self.low_seq[up] = new_low[raised], new_seq[raised]
        # the running lowest over every event of the instance so far
        run_value = np.minimum.reduceat(low, bounds)
        run_at = np.minimum.reduceat(np.where(low == np.repeat(run_value, lengths), index, total), bounds)
        lower = run_value < self.run_low[inside]
        self.run_low[inside[lower]], self.run_seq[inside[lower]] = run_value[lower], seq[position[run_at[lower]]]

    def rises(self, before_last: int, end_ns: int) -> list[tuple[int, int, str, int, int]]:
        """The rise to the highest point inside each closed instance, the largest few: (low seq,
        high seq, "range", live at the high, live before the low); `before_last`: the series'
        live bytes before its last event (an instance after every event starts there)."""
        closed = self.end < min(OPEN_END, max(end_ns, 0))
        before = np.where(self.seen, self.before, before_last)[closed]
        highest, high_seq, low, low_seq = (self.highest[closed], self.high_seq[closed], self.low[closed],
                                           self.low_seq[closed])
        rise = highest - before  # int64, wrapping for an instance with no event: never among the largest kept
        return [(int(low_seq[i]), int(high_seq[i]), "range", int(highest[i]), int(low[i]))
                for i in _largest(rise, CANDIDATES).tolist() if high_seq[i] >= 0 and highest[i] > low[i]]


class _Series:
    """What the first look keeps of one (process, device) series."""

    def __init__(self, window_ns: int, ranges: Optional[tuple[list, list]]) -> None:
        self.window_ns, self.live, self.before_last = window_ns, 0, 0
        self.highest, self.lowest, self.first_ts, self.last_ts = _LOW, _HIGH, None, 0
        self.grids = [_Grid(0), _Grid(window_ns // 2)]
        self.instances = _Instances(*ranges) if ranges else None

    def add(self, seq: np.ndarray, ts: np.ndarray, live: np.ndarray, delta: np.ndarray) -> None:
        before = live - delta  # live just before each event
        self.highest, self.lowest = max(self.highest, int(live.max())), min(self.lowest, int(live.min()))
        self.first_ts = int(ts[0]) if self.first_ts is None else self.first_ts
        self.last_ts = int(ts[-1])
        for grid in self.grids:
            grid.add(seq, ts, live, before, self.window_ns)
        if self.instances is not None:
            self.instances.add(seq, ts, live, before)
        self.live, self.before_last = int(live[-1]), int(before[-1])

    def candidates(self, end_ns: int) -> list[tuple[int, int, str, int, int]]:
        """The rises of both grids and of the range instances: (low seq, high seq, how, live at the
        high, live before the low). A grid whose cells, shifted down by more than the whole range of
        the values, would overflow int64 finds nothing (its rises are not all measured right)."""
        spread = max(self.highest, 0) - min(self.lowest, 0) + 1
        found = []
        for grid in self.grids:
            cells = (self.last_ts + grid.offset) // self.window_ns - (self.first_ts + grid.offset) // self.window_ns
            if spread * (cells + 1) < 2**62:
                found += [(low, high, "window", live, low_value) for rise, high, low, live, low_value in grid.best
                          if rise > 0]
        return found + (self.instances.rises(self.before_last, end_ns) if self.instances is not None else [])


@dataclass
class _Watch:
    """A chosen spike, measured on the second look: what grew inside it (bytes per API code; per
    site code [bytes, allocations, its first one's NVTX range code, whether they had several]),
    the event at its top (seq, pid, tid, ts), what came back after."""

    low: int
    high: int
    how: str
    start_level: int
    peak_level: int
    start_ns: int = 0
    peak_ns: int = 0
    top: Optional[tuple[int, int, int, int]] = None
    apis: dict = field(default_factory=dict)
    sites: dict = field(default_factory=dict)
    lowest_after: int = _HIGH
    given_back_ns: Optional[int] = None

    def measure(self, b, rows: np.ndarray, seq: np.ndarray, live: np.ndarray) -> None:
        """One batch of the spike's series (`rows` of `b`, their `seq` and live bytes)."""
        # seq rises through a batch: the spike's rows are a slice of its series'
        low, high = np.searchsorted(seq, [self.low, self.high], side="left").tolist()
        end = int(np.searchsorted(seq, self.high, side="right"))
        if low < len(seq) and seq[low] == self.low:
            self.start_ns = int(b.ts[rows[low]])
        if high < len(seq) and seq[high] == self.high:
            at = int(rows[high])
            self.top = (self.high, int(b.pid[at]), int(b.calls["tid"][at]) if "tid" in b.calls else -1,
                        int(b.ts[at]))
            self.peak_ns = int(b.ts[at])
        if high < len(seq):
            after = live[high:]
            self.lowest_after = min(self.lowest_after, int(after.min()))
            back = np.flatnonzero(after <= self.start_level)
            if self.given_back_ns is None and len(back):
                self.given_back_ns = int(b.ts[rows[high + back[0]]])
        grown = rows[low:end][b.delta[rows[low:end]] > 0]
        if len(grown):
            self._grown(b, grown)

    def _grown(self, b, grown: np.ndarray) -> None:
        labelled = [b.calls[name][grown] if name in b.calls else np.zeros(len(grown), "int64")
                    for name in ("api", "site", "nvtx_range")]
        api, site, name = (np.asarray(codes).astype("int64") for codes in labelled)
        size = b.bytes[grown]
        codes, slot = np.unique(api, return_inverse=True)
        totals = np.zeros(len(codes), "int64")
        np.add.at(totals, slot, size)
        for code, total in zip(codes.tolist(), totals.tolist()):  # a few APIs
            self.apis[code] = self.apis.get(code, 0) + total
        # per site (peak.made_of): bytes, allocations, its first one's NVTX range, and whether it had several
        present, first, slot = np.unique(site, return_index=True, return_inverse=True)
        totals, counts = np.zeros(len(present), "int64"), np.bincount(slot, minlength=len(present))
        np.add.at(totals, slot, size)
        names = np.bincount(np.unique(slot.astype("int64") << 32 | (name & 0xFFFFFFFF)) >> 32, minlength=len(present))
        for code, total, count, first_name, several in zip(present.tolist(), totals.tolist(), counts.tolist(),
                                                           name[first].tolist(), (names > 1).tolist()):
            entry = self.sites.setdefault(code, [0, 0, first_name, False])
            entry[0] += total
            entry[1] += count
            entry[3] = entry[3] or several or first_name != entry[2]


def _largest(values: np.ndarray, count: int) -> np.ndarray:
    """Positions of the `count` largest values, largest first (a partition, not a sort of all)."""
    if len(values) > count:
        values_at = np.argpartition(-values, count)[:count]
    else:
        values_at = np.arange(len(values))
    return values_at[np.argsort(-values[values_at], kind="stable")]


def _distinct(candidates: list[tuple[int, int, str]], live: dict, before: dict,
              top: int) -> list[tuple[int, int, str]]:
    """The largest rises whose spans do not overlap; a rise found both ways counts once, named by
    its range when one holds it."""
    # Every tie broken by position: the order of a set of tuples with strings differs between
    # processes (hash randomization), and a batch on Dask must give the numbers a local run gives.
    ranked = sorted(set(candidates), key=lambda c: (-(int(live[c[1]]) - int(before[c[0]])), c[2] != "range",
                                                     c[0], c[1]))
    chosen: list[tuple[int, int, str]] = []
    for low, high, how in ranked:
        if all(high < l or low > h for l, h, _ in chosen):
            chosen.append((low, high, how))
            if len(chosen) == top:
                break
    return chosen
