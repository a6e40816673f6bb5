"""Time windows over live-bytes series that arrive a batch at a time: what the analyses read of a
series inside a window (the steps' and phases', step_windows.py; the most live bytes while a range
was open, ranges.RangeSums), kept as a few numbers per window instead of the series.

API (`Windows`):

    windows = Windows()
    ids = windows.open(series, start_ns, end_ns)   # before any batch holding rows of `series`
    windows.add_series(key, ts, live, values)       # each batch's rows of one series, in time order
    windows.finish()                                # after the last batch
    windows.before[ids], windows.at_start[ids], windows.high[ids], windows.high_after[ids],
    windows.end[ids], windows.summed[ids]           # int64 arrays, by window id

- `open(series, start_ns, end_ns)`: windows [start, end] (both ends inclusive; end clipped up to
  start, as read.py reads NVTX ranges) on the series `series` (any int key); returns their ids,
  numbered from 0 in the order opened. A window whose end is not known yet (a range never
  closed) takes an end past every event, e.g. np.iinfo("int64").max: an end at the capture's end
  is the same window, since no event lies beyond the capture's end.
- `add_series(key, ts, live, values=None)`: one batch's rows of the series `key`; per row its
  time, the series' live bytes right after the row (a running sum carried across batches:
  groups.batch_series) and optionally a value to sum over the window (e.g. max(delta, 0): the
  bytes allocated). A series without windows is skipped. Equal times may straddle batches.
- After `finish()`, per window (values before a series' first event are 0):
  `before`     live after every event with ts < start (steps' and phases' start_live: padded[first])
  `at_start`   live after every event with ts <= start (ranges' value carried into the window)
  `high`       max live over the events with start <= ts <= end, LOW when none
  `high_after` max live over the events with start < ts <= end, LOW when none
  `end`        live after every event with ts <= end (steps' end_live: padded[stop])
  `summed`     sum of `values` over the events with start <= ts <= end
  So steps' peak is max(before, high), ranges' max_live max(at_start, high_after).

Fed by step_windows.StepWindows (the series of groups.batch_series) and ranges.RangeSums (its own
running sums per process of GPU-resident memory): a series' windows are opened when it first
appears (RangeSums opens them all before the first batch).

Memory: the per-window numbers, and per series the ids of the windows that are open (started,
their end not yet passed); each batch touches only those and the windows it starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

LOW = np.iinfo("int64").min


def range_max(values: np.ndarray, first: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """max(values[first:stop]) per window, LOW for an empty window."""
    if len(values) == 0:
        return np.full(len(first), LOW, "int64")
    padded = np.append(values, LOW)  # reduceat needs an index in range; empty windows read the pad
    bounds = np.empty(2 * len(first), "int64")
    bounds[0::2], bounds[1::2] = first, np.maximum(stop, first + 1)
    result = np.maximum.reduceat(padded, np.minimum(bounds, len(values)))[0::2]
    return np.where(stop > first, result, LOW)


@dataclass
class _Series:
    """One series' windows sorted by start, how many have started, which are open, its last value."""

    order: np.ndarray = field(default_factory=lambda: np.zeros(0, "int64"))  # ids by start
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, "int64"))  # sorted
    started: int = 0
    open: np.ndarray = field(default_factory=lambda: np.zeros(0, "int64"))
    last: int = 0


class Windows:
    """Per-window aggregates of live-bytes series fed batch by batch (see the module's docstring)."""

    def __init__(self) -> None:
        self._series: dict[int, _Series] = {}
        self.count = 0
        self.start_ns = self.end_ns = np.zeros(0, "int64")
        self.before = self.at_start = self.end = self.summed = np.zeros(0, "int64")
        self.high = self.high_after = np.zeros(0, "int64")

    def open(self, series: int, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
        """Windows on `series` (see the module's docstring); their ids."""
        start = np.asarray(start_ns, "int64")
        end = np.maximum(np.asarray(end_ns, "int64"), start)
        ids = np.arange(self.count, self.count + len(start), dtype="int64")
        self.count += len(start)
        self.start_ns, self.end_ns = np.concatenate([self.start_ns, start]), np.concatenate([self.end_ns, end])
        grow = np.zeros(len(start), "int64")
        self.before, self.at_start, self.end, self.summed = (np.concatenate([a, grow]) for a in
                                                             (self.before, self.at_start, self.end, self.summed))
        self.high, self.high_after = (np.concatenate([a, grow + LOW]) for a in (self.high, self.high_after))
        s = self._series.setdefault(int(series), _Series())
        unstarted = s.order[s.started:]
        # The windows not started yet, sorted again with the new ones (stable: by start, then id).
        waiting = np.concatenate([unstarted, ids])
        waiting = waiting[np.argsort(self.start_ns[waiting], kind="stable")]
        s.order = np.concatenate([s.order[:s.started], waiting])
        s.starts = self.start_ns[s.order]
        return ids

    def add_series(self, key: int, ts: np.ndarray, live: np.ndarray, values: Optional[np.ndarray] = None) -> None:
        """One batch's rows of the series `key` (see the module's docstring)."""
        s = self._series.get(int(key))
        if s is not None and len(s.order) and len(ts):
            self._add(s, ts, live, values)

    def finish(self) -> None:
        """Windows that never started (no event at or after their start) hold their series' last value."""
        for s in self._series.values():  # one per series
            waiting = s.order[s.started:]
            self.before[waiting] = self.at_start[waiting] = self.end[waiting] = s.last
            s.started = len(s.order)
            s.open = np.zeros(0, "int64")

    def _add(self, s: _Series, ts: np.ndarray, live: np.ndarray, values: Optional[np.ndarray]) -> None:
        last_ts = int(ts[-1])
        # Started: an event at or after the window's start has come; every later event is too.
        upto = int(np.searchsorted(s.starts, last_ts, side="right"))
        new = s.order[s.started:upto]
        s.started = upto
        ids = np.concatenate([s.open, new])
        fresh = np.zeros(len(ids), bool)
        fresh[len(s.open):] = True
        start, end = self.start_ns[ids], self.end_ns[ids]
        below = np.searchsorted(ts, start, side="left")  # events before the start
        upto_start = np.searchsorted(ts, start, side="right")  # events at or before it
        stop = np.searchsorted(ts, end, side="right")  # events at or before the end
        padded = np.concatenate([[s.last], live])  # padded[i]: live after the batch's first i events
        # The events before a window's start all come before the batch that starts it; the value
        # at its start or end changes only in a batch holding events at or before that time.
        self.before[ids[fresh]] = padded[below[fresh]]
        moved = fresh | (upto_start > 0)
        self.at_start[ids[moved]] = padded[upto_start[moved]]
        moved = fresh | (stop > 0)
        self.end[ids[moved]] = padded[stop[moved]]
        self.high[ids] = np.maximum(self.high[ids], range_max(live, below, stop))
        self.high_after[ids] = np.maximum(self.high_after[ids], range_max(live, upto_start, stop))
        if values is not None:
            cum = np.concatenate([[0], np.cumsum(values.astype("int64", copy=False))])
            self.summed[ids] += cum[stop] - cum[below]
        # Open while a later event can still fall inside: later events come at last_ts or after.
        s.open = ids[end >= last_ts]
        s.last = int(live[-1])
