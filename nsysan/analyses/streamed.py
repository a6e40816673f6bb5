"""The `--quick` analyses over a flow of time-ordered event batches, in bounded memory.

What `run_analyses` finds over the whole events frame, found from running sums instead: the flow
of events (events/stream.py) is read twice. The first look sums per (process, device, kind)
group, per process and per spike series, keeps the largest allocations, the big blocks and the
spikes' candidate rises (this module, with the running sums and keyed columns both looks use);
the second (streamed_second.py), knowing every group's span and the pools' reserve, downsamples
the timeline, finds each peak with the live set at that moment and fills in what lies after a
moment. Only the live allocations, the aggregates and the kept points stay in memory.
analyses.md says what is exact (all of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pandas as pd

from ..events.arrays import group_order
from ..events.stream import EventBatch
from ..model import GPU_RESIDENT_KINDS, KINDS
from .spikes import CANDIDATES

RESIDENT = [KINDS.index(k) for k in GPU_RESIDENT_KINDS]
STATIC = KINDS.index("static")
SPIKE_KINDS = [KINDS.index("device"), KINDS.index("array")]
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
SERIES_COLUMNS = ("live", "highest", "lowest", "events", "first_ts", "last_ts")


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
    spike_series: Keyed = field(default_factory=lambda: Keyed(SERIES_COLUMNS, {"highest": LOW, "lowest": HIGH,
                                                                                "first_ts": HIGH, "last_ts": LOW}))
    cut: Keyed = field(default_factory=lambda: Keyed(("live", "highest", "events", "last_ts"),
                                                     {"highest": LOW, "last_ts": LOW}))
    pairs: dict = field(default_factory=dict)  # (pid, device) of resident events -> whether any is not static
    rises: dict = field(default_factory=dict)  # spike series code -> [Rises per grid]
    first_ts: int = HIGH
    last_ts: int = LOW
    moved: float = 0.0
    last_moving_ts: Optional[int] = None
    # the largest allocations and how many there were (explore.LargestAllocations' answer), set
    # once this look is done, for the second look and the consumers after it
    allocations: int = 0
    largest: pd.DataFrame = field(default_factory=lambda: no_rows())
    big_blocks: list = field(default_factory=list)
    pools: Optional[Any] = None  # streamed_pools.PoolSums
    # The last batch's running sums, for the consumers after this one (windows.py):
    # "spikes" per (process, device) of device + array memory (steps.live_series), "resident" per
    # process of GPU-resident memory (ranges._max_live_while_open); each (rows, series codes, live).
    batch_live: dict = field(default_factory=dict)

    def add(self, b: EventBatch) -> None:
        self.batch_live = {}
        if self.pools is not None:
            self.pools.add(b)
        if len(b) == 0:
            return
        self.first_ts, self.last_ts = min(self.first_ts, int(b.ts[0])), max(self.last_ts, int(b.ts[-1]))
        resident = np.isin(b.kind, RESIDENT)
        for key, not_static in pd.DataFrame({"k": pair_key(b.pid[resident], b.device[resident]),
                                             "s": b.kind[resident] != STATIC}).groupby("k")["s"].any().items():
            self.pairs[int(key)] = self.pairs.get(int(key), False) or bool(not_static)
        self._cut(b, resident)
        self._spikes(b)
        moving = np.flatnonzero(b.delta != 0)
        if len(moving):
            self.moved = float(np.cumsum(np.concatenate([[self.moved], np.abs(b.delta[moving]).astype("float64")]))[-1])
            self.last_moving_ts = int(b.ts[moving[-1]])
        allocs = np.flatnonzero(b.is_alloc)
        big = allocs[(b.kind[allocs] == KINDS.index("device")) & (b.bytes[allocs] >= PREALLOCATION_BYTES)]
        if len(big):
            self.big_blocks.append(_rows(b, big))

    def _cut(self, b: EventBatch, resident: np.ndarray) -> None:
        rows = np.flatnonzero(resident)
        if not len(rows):
            return
        c = self.cut
        codes = c.codes(b.pid[rows])
        live = running_sums(codes, b.delta[rows], c["live"])
        self.batch_live["resident"] = (rows, codes, live)
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
        self.batch_live["spikes"] = (rows, codes, live)
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
    top = _top_rises(rise, seq)
    found = [(int(rise[i]), int(seq[i]), int(seq[run_at[i]]) if run_at[i] >= 0 else grid.low_seq,
              int(live[i]), int(run_low[i])) for i in top.tolist()]
    grid.best = sorted(grid.best + found, key=lambda c: (-c[0], c[1]))[:CANDIDATES]
    grid.cell, grid.low_value = int(cell[-1]), int(run_low[-1])
    grid.low_seq = int(seq[run_at[-1]]) if run_at[-1] >= 0 else grid.low_seq


def _top_rises(rise: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The CANDIDATES rows of the largest rise, then earliest: the first of a lexsort of (-rise,
    seq), sorting only the rows that rise at least as far as the CANDIDATES-th largest (a full
    sort of every row of the batch cost 2 of the streamed full analysis's CPU s at 1e7)."""
    if len(rise) > CANDIDATES:
        kth = np.partition(rise, len(rise) - CANDIDATES)[len(rise) - CANDIDATES]
        pool = np.flatnonzero(rise >= kth)
        return pool[np.lexsort((seq[pool], -rise[pool]))[:CANDIDATES]]
    return np.lexsort((seq, -rise))[:CANDIDATES]


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


def no_rows() -> pd.DataFrame:
    """_rows of no row: the columns, empty."""
    return pd.DataFrame({c: np.zeros(0, "uint64" if c == "address" else "int64")
                         for c in ("seq", "ts", "pid", "device", "kind", "address", "bytes")})


def _rows(b: EventBatch, rows: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"seq": b.seq[rows], "ts": b.ts[rows], "pid": b.pid[rows], "device": b.device[rows],
                         "kind": b.kind[rows], "address": b.address[rows], "bytes": b.bytes[rows]})
