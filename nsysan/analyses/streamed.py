"""The `--quick` analyses over a flow of time-ordered event batches, in bounded memory.

What `run_analyses` finds over the whole events frame, found from running sums instead: the flow
of events (events/stream.py) is read twice. The first look sums per (process, device, kind)
group, per process and per spike series, keeps the largest allocations, the big blocks and the
spikes' candidate rises; the second, knowing every group's span and the pools' reserve,
downsamples the timeline, finds each peak with the live set at that moment (kept at the highest
point of each batch that beats the peak so far), and fills in what lies after a moment (the free
times of listed allocations, where a spike gave its memory back). Only the live allocations, the
aggregates and the kept points stay in memory. analyses.md says what is exact (all of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pandas as pd

from ..events.stream import EventBatch
from ..model import GPU_RESIDENT_KINDS, KINDS
from .arrays import group_order
from .explore import MAX_INTERVALS
from .never_freed import MAX_LISTED, NOT_LEAKS
from .peak import LIVE_AT_PEAK
from .spikes import CANDIDATES
from .timeline import MAX_POINTS

RESIDENT = [KINDS.index(k) for k in GPU_RESIDENT_KINDS]
STATIC = KINDS.index("static")
SPIKE_KINDS = [KINDS.index("device"), KINDS.index("array")]
LEAK_EXEMPT = [KINDS.index(k) for k in NOT_LEAKS]
PREALLOCATION_BYTES = 1 << 30  # find_preallocations looks at blocks of a GiB or more


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


LOW, HIGH = np.iinfo("int64").min, np.iinfo("int64").max
GROUP_COLUMNS = ("live", "peak", "peak_ts", "first_ts", "last_ts", "events", "allocations", "allocated", "orphans",
                 "orphan_bytes", "closed", "closed_bytes")
SERIES_COLUMNS = ("live", "highest", "lowest", "events", "first_ts", "last_ts")


def group_key(pid: np.ndarray, device: np.ndarray, kind: np.ndarray) -> np.ndarray:
    """(pid, device, kind) packed as timeline.group_events packs them: their sort is the groups' order."""
    return (pid.astype("int64") << 24) | ((device.astype("int64") + 1) << 8) | kind.astype("int64")


def pair_key(pid: np.ndarray, device: np.ndarray) -> np.ndarray:
    return (pid.astype("int64") << 16) | (device.astype("int64") & 0xFFFF)


@dataclass
class Rises:
    """One spike series' rises within one grid of windows: the open cell and its lowest point, and
    the largest rises so far as (rise, high seq, low seq)."""

    offset: int
    cell: Optional[int] = None
    low_value: int = 0
    low_seq: int = -1
    best: list = field(default_factory=list)


@dataclass
class FirstLook:
    """What one pass over the events sums up (see the module's docstring)."""

    window_ns: int
    groups: Keyed = field(default_factory=lambda: Keyed(GROUP_COLUMNS, {"peak": LOW, "first_ts": HIGH,
                                                                         "last_ts": LOW}))
    spike_series: Keyed = field(default_factory=lambda: Keyed(SERIES_COLUMNS, {"highest": LOW, "lowest": HIGH,
                                                                                "first_ts": HIGH, "last_ts": LOW}))
    cut: Keyed = field(default_factory=lambda: Keyed(("live", "highest", "events", "last_ts"),
                                                     {"highest": LOW, "last_ts": LOW}))
    pairs: dict = field(default_factory=dict)  # (pid, device) of resident events -> whether any is not static
    devices: dict = field(default_factory=dict)  # pid -> its devices
    rises: dict = field(default_factory=dict)  # spike series code -> [Rises per grid]
    first_ts: int = HIGH
    last_ts: int = LOW
    moved: float = 0.0
    last_moving_ts: Optional[int] = None
    allocations: int = 0
    largest: pd.DataFrame = field(default_factory=pd.DataFrame)
    closed: list = field(default_factory=list)  # allocations never to be freed, largest kept
    closed_groups: list = field(default_factory=list)
    big_blocks: list = field(default_factory=list)
    pools: Optional[Any] = None  # streamed_pools.PoolSums

    def add(self, b: EventBatch) -> None:
        if self.pools is not None:
            self.pools.add(b)
        if len(b) == 0:
            return
        self.first_ts, self.last_ts = min(self.first_ts, int(b.ts[0])), max(self.last_ts, int(b.ts[-1]))
        self._groups(b)
        resident = np.isin(b.kind, RESIDENT)
        for key, not_static in pd.DataFrame({"k": pair_key(b.pid[resident], b.device[resident]),
                                             "s": b.kind[resident] != STATIC}).groupby("k")["s"].any().items():
            self.pairs[int(key)] = self.pairs.get(int(key), False) or bool(not_static)
        for key in pd.unique(pair_key(b.pid, b.device)).tolist():
            self.devices.setdefault(key >> 16, set()).add((key & 0xFFFF) - 0x10000 if key & 0x8000 else key & 0xFFFF)
        self._cut(b, resident)
        self._spikes(b)
        moving = np.flatnonzero(b.delta != 0)
        if len(moving):
            self.moved = float(np.cumsum(np.concatenate([[self.moved], np.abs(b.delta[moving]).astype("float64")]))[-1])
            self.last_moving_ts = int(b.ts[moving[-1]])
        allocs = np.flatnonzero(b.is_alloc)
        self.allocations += len(allocs)
        top = allocs[np.lexsort((b.seq[allocs], -b.bytes[allocs]))[:MAX_INTERVALS]]
        self.largest = _top(pd.concat([self.largest, _rows(b, top)], ignore_index=True), MAX_INTERVALS)
        big = allocs[(b.kind[allocs] == KINDS.index("device")) & (b.bytes[allocs] >= PREALLOCATION_BYTES)]
        if len(big):
            self.big_blocks.append(_rows(b, big))
        self.add_closed(b.closed)

    def add_closed(self, closed: dict) -> None:
        """Allocations that will never be freed: counted in their group, the largest kept to list."""
        if not len(closed.get("seq", [])):
            return
        frame = pd.DataFrame(closed)
        codes = self.groups.codes(group_key(frame["pid"].to_numpy(), frame["device"].to_numpy(),
                                            frame["kind"].to_numpy()))
        np.add.at(self.groups["closed"], codes, 1)
        np.add.at(self.groups["closed_bytes"], codes, frame["bytes"].to_numpy())
        leaks = frame[~frame["kind"].isin(LEAK_EXEMPT).to_numpy()]
        self.closed_groups.append(leaks)
        self.closed = [_top(pd.concat(self.closed + [leaks], ignore_index=True), MAX_LISTED, by_time=True)]

    def _groups(self, b: EventBatch) -> None:
        g = self.groups
        codes = g.codes(group_key(b.pid, b.device, b.kind))
        live = running_sums(codes, b.delta, g["live"])
        frame = pd.DataFrame({"g": codes, "live": live, "ts": b.ts})
        per = frame.groupby("g")
        highest = per["live"].max()
        at_highest = frame[live == highest.reindex(codes).to_numpy()].groupby("g")["ts"].first()
        better = highest.to_numpy() > g["peak"][highest.index]
        g["peak"][highest.index[better]] = highest.to_numpy()[better]
        g["peak_ts"][highest.index[better]] = at_highest.reindex(highest.index).to_numpy()[better]
        first, last = per["ts"].min(), per["ts"].max()
        g["first_ts"][first.index] = np.minimum(g["first_ts"][first.index], first.to_numpy())
        g["last_ts"][last.index] = np.maximum(g["last_ts"][last.index], last.to_numpy())
        np.add.at(g["events"], codes, 1)
        np.add.at(g["allocations"], codes, b.is_alloc.astype("int64"))
        np.add.at(g["allocated"], codes, np.where(b.is_alloc, b.bytes, 0))
        orphan = ~b.is_alloc & (b.partner_seq < 0)
        np.add.at(g["orphans"], codes, orphan.astype("int64"))
        np.add.at(g["orphan_bytes"], codes, np.where(orphan, b.bytes, 0))

    def _cut(self, b: EventBatch, resident: np.ndarray) -> None:
        rows = np.flatnonzero(resident)
        if not len(rows):
            return
        c = self.cut
        codes = c.codes(b.pid[rows])
        live = running_sums(codes, b.delta[rows], c["live"])
        np.maximum.at(c["highest"], codes, live)
        np.add.at(c["events"], codes, 1)
        np.maximum.at(c["last_ts"], codes, b.ts[rows])

    def _spikes(self, b: EventBatch) -> None:
        rows = np.flatnonzero(np.isin(b.kind, SPIKE_KINDS))
        if not len(rows):
            return
        s = self.spike_series
        codes = s.codes(pair_key(b.pid[rows], b.device[rows]))
        live = running_sums(codes, b.delta[rows], s["live"])
        np.maximum.at(s["highest"], codes, live)
        np.minimum.at(s["lowest"], codes, live)
        np.add.at(s["events"], codes, 1)
        np.minimum.at(s["first_ts"], codes, b.ts[rows])
        np.maximum.at(s["last_ts"], codes, b.ts[rows])
        for code in np.unique(codes).tolist():  # a few (process, device) series
            mine = codes == code
            seq, ts, value = b.seq[rows[mine]], b.ts[rows[mine]], live[mine]
            previous = np.concatenate([[int(value[0]) - int(b.delta[rows[mine][0]])], value[:-1]])
            grids = self.rises.setdefault(code, [Rises(0), Rises(self.window_ns // 2)])
            for grid in grids:
                _grid_rises(grid, seq, ts, value, previous, self.window_ns)


def _grid_rises(grid: Rises, seq: np.ndarray, ts: np.ndarray, live: np.ndarray, before: np.ndarray,
                window_ns: int) -> None:
    """spikes._window_rises over one batch of a series, the open cell carried across batches."""
    cell = (ts + grid.offset) // max(window_ns, 1)
    # the lowest `before` so far in each row's cell, and where it was first reached
    starts = np.flatnonzero(np.concatenate([[True], cell[1:] != cell[:-1]]))
    lows = before.copy()
    low_at = np.arange(len(before))
    if grid.cell is not None and cell[0] == grid.cell and grid.low_value <= before[0]:
        lows[0], low_at[0] = grid.low_value, -1
    run_low = _running_min_per_cell(lows, cell, starts)
    # the first position of each running minimum: where it last dropped (or its cell began)
    dropped = np.zeros(len(lows), bool)
    dropped[starts] = True
    dropped[1:] |= run_low[1:] < run_low[:-1]
    run_at = low_at[np.maximum.accumulate(np.where(dropped, np.arange(len(lows)), 0))]
    rise = live - run_low
    top = np.lexsort((seq, -rise))[:CANDIDATES]
    found = [(int(rise[i]), int(seq[i]), int(seq[run_at[i]]) if run_at[i] >= 0 else grid.low_seq,
              int(live[i]), int(run_low[i])) for i in top.tolist()]
    grid.best = sorted(grid.best + found, key=lambda c: (-c[0], c[1]))[:CANDIDATES]
    grid.cell, grid.low_value = int(cell[-1]), int(run_low[-1])
    grid.low_seq = int(seq[run_at[-1]]) if run_at[-1] >= 0 else grid.low_seq


def _running_min_per_cell(values: np.ndarray, cell: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The running minimum of `values`, restarting where each cell starts (`starts`). As in
    spikes._window_rises: each cell shifted down by more than the values' whole range, one
    accumulate does every cell; cell by cell when the shift would overflow."""
    spread = int(values.max()) - int(values.min()) + 1
    begins = np.zeros(len(values), "int64")
    begins[starts] = 1
    steps = np.cumsum(begins) - 1  # the cell's number in the batch
    if spread * (int(steps[-1]) + 1) < 2**62:
        shift = steps * spread
        low = values - shift
        np.minimum.accumulate(low, out=low)
        return low + shift
    low = np.empty_like(values)
    for a, z in zip(starts.tolist(), np.append(starts[1:], len(cell)).tolist()):  # one per cell
        low[a:z] = np.minimum.accumulate(values[a:z])
    return low


def _rows(b: EventBatch, rows: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"seq": b.seq[rows], "ts": b.ts[rows], "pid": b.pid[rows], "device": b.device[rows],
                         "kind": b.kind[rows], "address": b.address[rows], "bytes": b.bytes[rows]})


def _top(frame: pd.DataFrame, limit: int, by_time: bool = False) -> pd.DataFrame:
    """The `limit` largest allocations (then earliest: by time for never_freed_rows, else by row)."""
    if frame.empty:
        return frame
    keys = ["bytes", "ts", "seq"] if by_time else ["bytes", "seq"]
    return frame.sort_values(keys, ascending=[False] + [True] * (len(keys) - 1), kind="stable").head(limit) \
        .reset_index(drop=True)


@dataclass
class PeakSeries:
    """GPU-resident live bytes (and pools' unused reserve) of one (process, device), or of every
    process on one GPU (pid None), with the live set kept at its highest point so far."""

    pid: Optional[int]
    device: int
    gpu: Optional[int]
    members: np.ndarray  # pair keys
    live: int = 0
    reserve: int = 0
    best: int = LOW
    best_seq: int = -1
    best_ts: int = 0
    best_kind: int = 0
    best_reserve: int = 0
    live_set: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the last allocation not of module statics, and the statics' bytes since (peak notes)
    own_ts: Optional[int] = None
    statics_since: int = 0
    note_own_ts: Optional[int] = None
    note_statics: int = 0


@dataclass
class SpikeWatch:
    """A chosen spike, measured on the second look: what grew inside it, what came back after."""

    series: int  # code in FirstLook.spike_series
    low: int
    high: int
    how: str
    start_level: int
    peak_level: int
    start_ns: int = 0
    peak_ns: int = 0
    grown_bytes: int = 0
    grown: int = 0
    grown_statics: int = 0
    lowest_after: int = HIGH
    given_back_ns: Optional[int] = None


@dataclass
class SecondLook:
    """The pass that needs the first look's totals (see the module's docstring)."""

    first: FirstLook
    peaks: list[PeakSeries]
    changes: dict  # pair key -> (ts sorted, bytes, how many taken): pools' unused reserve changes
    spikes: list[SpikeWatch]
    focus_target: float
    cut_rows: dict  # pid -> the index of the row whose live bytes tell "climbing"
    group_live: np.ndarray = field(default_factory=lambda: np.zeros(0, "int64"))
    points: dict = field(default_factory=dict)  # group code -> list of frames (seq, ts, live, bucket)
    spike_live: np.ndarray = field(default_factory=lambda: np.zeros(0, "int64"))
    cut_live: dict = field(default_factory=dict)
    cut_seen: dict = field(default_factory=dict)
    cut_value: dict = field(default_factory=dict)
    moved: float = 0.0
    focus_ts: Optional[int] = None
    closed: list = field(default_factory=list)
    free_ts: dict = field(default_factory=dict)  # allocation seq -> its free's time, for listed ones
    wanted: set = field(default_factory=set)
    pools: Optional[Any] = None  # streamed_pools.PoolSeries, filling `changes` batch by batch

    def __post_init__(self) -> None:
        self.group_live = np.zeros(len(self.first.groups.keys()), "int64")
        self.spike_live = np.zeros(len(self.first.spike_series.keys()), "int64")
        self.wanted = set(self.first.largest["seq"].tolist()) if not self.first.largest.empty else set()

    def add(self, b: EventBatch) -> None:
        if self.pools is not None:  # the pools' reserve changes up to this batch into `changes`
            self.pools.add(b)
        if len(b) == 0:
            return
        self._timeline(b)
        self._peaks(b)  # before the free times: a peak's live set may be freed later in this batch
        frees = np.flatnonzero(b.partner_seq >= 0)
        if self.wanted and len(frees):
            hit = np.isin(b.partner_seq[frees], np.fromiter(self.wanted, "int64"))
            for alloc, ts in zip(b.partner_seq[frees[hit]].tolist(), b.ts[frees[hit]].tolist()):
                self.free_ts[alloc] = ts
        self._spikes(b)
        self._cut(b)
        if self.focus_ts is None:
            moving = np.flatnonzero(b.delta != 0)
            moved = np.cumsum(np.concatenate([[self.moved], np.abs(b.delta[moving]).astype("float64")]))[1:]
            at = int(np.searchsorted(moved, self.focus_target, side="left"))
            if at < len(moving):
                self.focus_ts = int(b.ts[moving[at]])
            self.moved = float(moved[-1]) if len(moved) else self.moved
        if len(b.closed.get("seq", [])):
            self.closed.append(pd.DataFrame(b.closed))

    def _timeline(self, b: EventBatch) -> None:
        g = self.first.groups
        codes = g.codes(group_key(b.pid, b.device, b.kind))
        live = running_sums(codes, b.delta, self.group_live)
        for code in np.unique(codes).tolist():  # one per group
            mine = codes == code
            ts, value, seq = b.ts[mine], live[mine], b.seq[mine]
            events, first_ts, last_ts = (int(g[c][code]) for c in ("events", "first_ts", "last_ts"))
            if events <= MAX_POINTS:
                kept = pd.DataFrame({"seq": seq, "ts": ts, "live": value, "bucket": -1})
            else:
                buckets = max(1, MAX_POINTS // 2)
                span = max(float(last_ts - first_ts), 1.0)
                bucket = ((ts - first_ts) / span * (buckets - 1)).astype("int64")
                frame = pd.DataFrame({"seq": seq, "ts": ts, "live": value, "bucket": bucket})
                per = frame.groupby("bucket", sort=False)
                highest = frame.loc[per["live"].idxmax()]  # the first row of each bucket's highest
                last = frame.loc[per["seq"].idxmax()]
                kept = pd.concat([frame.iloc[:1], highest, last])
            self.points.setdefault(code, []).append(kept)

    def series(self, code: int) -> tuple[list[int], list[int]]:
        """One group's downsampled (ts, live), as timeline._downsample keeps them."""
        kept = pd.concat(self.points[code], ignore_index=True)
        if (kept["bucket"] < 0).all():
            return kept["ts"].tolist(), kept["live"].tolist()
        first_seq = kept["seq"].min()
        per = kept.sort_values("seq", kind="stable").groupby("bucket", sort=False)
        top = kept.loc[kept.sort_values(["live", "seq"], ascending=[False, True], kind="stable")
                       .drop_duplicates("bucket").index]
        chosen = set(top["seq"].tolist()) | set(per["seq"].max().tolist()) | {first_seq}
        keep = kept[kept["seq"].isin(chosen)].drop_duplicates("seq").sort_values("seq")
        return keep["ts"].tolist(), keep["live"].tolist()

    def _peaks(self, b: EventBatch) -> None:
        resident = np.isin(b.kind, RESIDENT)
        pairs = pair_key(b.pid, b.device)
        for peak in self.peaks:  # a few series
            rows = np.flatnonzero(resident & np.isin(pairs, peak.members))
            if not len(rows):
                continue
            added = np.zeros(len(rows), "int64")
            for member in peak.members.tolist():  # the pools' reserve changes at the next event
                if member not in self.changes:
                    continue
                change_ts, change_bytes, used = self.changes[member]
                mine = np.flatnonzero(pairs[rows] == member)
                if not len(mine) or used >= len(change_ts):
                    continue
                ts = b.ts[rows[mine]]
                upto = int(np.searchsorted(change_ts, ts[-1], side="right"))
                at = np.searchsorted(ts, change_ts[used:upto], side="left")
                np.add.at(added, mine[at], change_bytes[used:upto])
                self.changes[member] = (change_ts, change_bytes, upto)
            reserve = peak.reserve + np.cumsum(added)
            live = peak.live + np.cumsum(b.delta[rows]) + reserve
            own = (b.kind[rows] != STATIC) & (b.delta[rows] > 0)
            at = int(np.argmax(live))
            if live[at] > peak.best:
                peak.best, peak.best_seq, peak.best_ts = int(live[at]), int(b.seq[rows[at]]), int(b.ts[rows[at]])
                peak.best_kind, peak.best_reserve = int(b.kind[rows[at]]), int(reserve[at])
                peak.live_set = self._live_at(b, peak.best_seq, peak.members)
                owns = np.flatnonzero(own[:at + 1])
                if len(owns):
                    peak.note_own_ts = int(b.ts[rows[owns[-1]]])
                    peak.note_statics = int(b.delta[rows[owns[-1] + 1:at + 1]].sum())
                else:
                    peak.note_own_ts = peak.own_ts
                    peak.note_statics = peak.statics_since + int(b.delta[rows[:at + 1]].sum())
                self.wanted |= set(peak.live_set.sort_values("bytes", ascending=False, kind="stable")
                                   ["seq"].head(LIVE_AT_PEAK).tolist())
            owns = np.flatnonzero(own)
            if len(owns):
                peak.own_ts, peak.statics_since = int(b.ts[rows[owns[-1]]]), int(b.delta[rows[owns[-1] + 1:]].sum())
            else:
                peak.statics_since += int(b.delta[rows].sum())
            peak.live, peak.reserve = int(live[-1] - reserve[-1]), int(reserve[-1])

    def _live_at(self, b: EventBatch, seq: int, members: np.ndarray) -> pd.DataFrame:
        """GPU-resident allocations of `members` live right after event `seq` of batch `b`: never
        freed, or freed after it (whole-frame: partner < 0 or partner > seq)."""
        allocs = np.flatnonzero(b.is_alloc & (b.seq <= seq))
        frame = pd.concat([pd.DataFrame(b.live_before)] + self.closed +
                          ([pd.DataFrame(b.closed)] if len(b.closed.get("seq", [])) else []) + [_rows(b, allocs)],
                          ignore_index=True)
        freed = b.partner_seq[(b.partner_seq >= 0) & (b.seq <= seq)]
        keep = ~frame["seq"].isin(freed).to_numpy() & frame["kind"].isin(RESIDENT).to_numpy() \
            & np.isin(pair_key(frame["pid"].to_numpy(), frame["device"].to_numpy()), members)
        return frame[keep].drop_duplicates("seq").sort_values("seq", ignore_index=True)

    def _spikes(self, b: EventBatch) -> None:
        if not self.spikes:
            return
        rows = np.flatnonzero(np.isin(b.kind, SPIKE_KINDS))
        s = self.first.spike_series
        codes = s.codes(pair_key(b.pid[rows], b.device[rows]))
        live = running_sums(codes, b.delta[rows], self.spike_live)
        for spike in self.spikes:  # a few per series
            mine = codes == spike.series
            seq, ts, value, delta = b.seq[rows[mine]], b.ts[rows[mine]], live[mine], b.delta[rows[mine]]
            inside = (seq >= spike.low) & (seq <= spike.high)
            grown = inside & (delta > 0)
            spike.grown_bytes += int(delta[grown].sum())
            spike.grown += int(grown.sum())
            spike.start_ns = int(ts[seq == spike.low][0]) if (seq == spike.low).any() else spike.start_ns
            spike.peak_ns = int(ts[seq == spike.high][0]) if (seq == spike.high).any() else spike.peak_ns
            after = seq >= spike.high
            if after.any():
                spike.lowest_after = min(spike.lowest_after, int(value[after].min()))
                back = np.flatnonzero(after & (value <= spike.start_level))
                if spike.given_back_ns is None and len(back):
                    spike.given_back_ns = int(ts[back[0]])

    def _cut(self, b: EventBatch) -> None:
        rows = np.flatnonzero(np.isin(b.kind, RESIDENT))
        for pid, wanted in self.cut_rows.items():  # a few processes
            mine = rows[b.pid[rows] == pid]
            seen = self.cut_seen.get(pid, 0)
            live = self.cut_live.get(pid, 0) + np.cumsum(b.delta[mine])
            if seen <= wanted < seen + len(mine):
                self.cut_value[pid] = int(live[wanted - seen])
            self.cut_seen[pid] = seen + len(mine)
            self.cut_live[pid] = int(live[-1]) if len(mine) else self.cut_live.get(pid, 0)
