"""Spikes: where live memory suddenly soared, without scrolling a timeline.

A spike is a rise of a (process, device)'s live device + array bytes from a low point to a high
point, found two ways: within a short window (default 10 ms, `--spike-window`), on two grids of
that width offset by half of it, so that any rise completed within half a window lies whole in
one cell; and within one innermost NVTX range instance. The largest rises per process and device
are kept, overlapping ones once, each with its time, size, the calls, sites and NVTX path that
made it, and whether (and when) live bytes fell back to where the rise began.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..events.arrays import category_codes
from ..model import Spike
from .peak import made_of
from .steps import LiveSeries, range_max

DEFAULT_WINDOW_NS = 10_000_000
TOP = 5  # per process and device
MAX_PARTS = 3  # APIs and sites named per spike
CANDIDATES = 64  # rises looked at per way of finding them: more than TOP, as overlapping ones are dropped


def find_spikes(events: pd.DataFrame, series: list[LiveSeries], innermost: list[tuple[int, int, int]],
                gpu_of, window_ns: int = DEFAULT_WINDOW_NS, top: int = TOP) -> list[Spike]:
    """The `top` largest rises per (process, device); `innermost` are the innermost NVTX range
    instances as (pid, start_ns, end_ns), measured too."""
    found = []
    for s in series:  # one per (process, device)
        if len(s.rows) == 0:
            continue
        before = np.concatenate([[0], s.live[:-1]])  # live just before each event
        # the whole range of the values, before or after an event (`before` adds only the 0)
        spread = int(max(s.live.max(), 0) - min(s.live.min(), 0)) + 1
        candidates = []
        for offset in (0, window_ns // 2):
            candidates += _window_rises(s.ts, s.live, before, window_ns, offset, spread)
        candidates += _range_rises(s.ts, s.live, before, [(a, b) for pid, a, b in innermost if pid == s.pid])
        for low, high, how in _distinct(candidates, s.live, before, top):
            found.append(_spike(events, s, gpu_of(s.pid, s.device), low, high, how, before))
    return found


def _window_rises(ts: np.ndarray, live: np.ndarray, before: np.ndarray, window_ns: int,
                  offset: int, spread: int) -> list[tuple[int, int, str]]:
    """(low point, high point) of the largest rises within one grid cell. The running minimum
    restarts in each cell: shifting each cell down by `spread`, more than the whole range of the
    values, one accumulate over all events does every cell."""
    cell = ts + offset
    cell //= max(window_ns, 1)
    cell -= cell[0]
    if spread * (int(cell[-1]) + 1) >= 2**62:  # the shift would overflow: the ranges still count
        return []
    # In place, one buffer for the shift and one for the running minimum: these are the passes
    # over every event of the analysis (4 per (process, device) at 1e7 events).
    shift = cell * spread
    rise = before - shift
    np.minimum.accumulate(rise, out=rise)
    rise += shift
    del shift
    np.subtract(live, rise, out=rise)  # the rise from the lowest point of the cell so far
    best = _largest(rise, CANDIDATES)
    result = []
    for high in best[rise[best] > 0].tolist():
        start = int(np.searchsorted(cell, cell[high], side="left"))
        result.append((start + int(np.argmin(before[start:high + 1])), high, "window"))
    return result


def _range_rises(ts: np.ndarray, live: np.ndarray, before: np.ndarray,
                 spans: list[tuple[int, int]]) -> list[tuple[int, int, str]]:
    """(low point, high point) of the rise to the highest point inside each range instance."""
    if not spans:
        return []
    starts, ends = np.array(spans, "int64").T
    first = np.searchsorted(ts, starts, side="left")
    stop = np.searchsorted(ts, ends, side="right")
    highest = np.maximum(range_max(live, first, stop), np.iinfo("int64").min)
    rise = highest - before[np.minimum(first, len(before) - 1)]
    result = []
    for i in _largest(rise, CANDIDATES).tolist():  # the largest few only
        if stop[i] > first[i]:
            high = int(first[i] + np.argmax(live[first[i]:stop[i]]))
            low = int(first[i] + np.argmin(before[first[i]:high + 1]))
            if live[high] > before[low]:
                result.append((low, high, "range"))
    return result


def _largest(values: np.ndarray, count: int) -> np.ndarray:
    """Positions of the `count` largest values, largest first (a partition, not a sort of 1e7)."""
    if len(values) > count:
        values_at = np.argpartition(-values, count)[:count]
    else:
        values_at = np.arange(len(values))
    return values_at[np.argsort(-values[values_at], kind="stable")]


def _distinct(candidates: list[tuple[int, int, str]], live: np.ndarray, before: np.ndarray,
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


def _spike(events: pd.DataFrame, s: LiveSeries, gpu: Optional[int], low: int, high: int, how: str,
           before: np.ndarray) -> Spike:
    rows = s.rows[low:high + 1]
    delta = events["delta_bytes"].to_numpy()[rows]
    grown = rows[delta > 0]
    start_level = int(before[low])
    after = s.live[high:]
    back = np.flatnonzero(after <= start_level)
    return Spike(pid=s.pid, device=s.device, gpu=gpu, found_by=how, start_ns=int(s.ts[low]),
                 peak_ns=int(s.ts[high]), rise_bytes=int(s.live[high]) - start_level, start_live_bytes=start_level,
                 peak_live_bytes=int(s.live[high]), nvtx_path=str(events["nvtx_path"].iat[int(s.rows[high])]),
                 apis=_ranked(events, "api", grown), sites=made_of(events, grown, MAX_PARTS),
                 freed_after_bytes=int(min(int(s.live[high]) - int(after.min()), int(s.live[high]) - start_level)),
                 given_back_ns=int(s.ts[high + back[0]]) if len(back) else None)


def _ranked(events: pd.DataFrame, column: str, rows: np.ndarray) -> list[str]:
    """The values of a categorical column at `rows`, by bytes allocated, largest first."""
    if len(rows) == 0:
        return []
    codes = category_codes(events[column])[rows]
    present, slot = np.unique(codes, return_inverse=True)
    sums = np.zeros(len(present), "int64")
    np.add.at(sums, slot, events["bytes"].to_numpy()[rows])
    # as groupby(codes).sum() gave them (the codes in order), sorted the same way
    totals = pd.Series(sums, index=present).sort_values(ascending=False)
    names = events[column].cat.categories
    return [str(names[c]) for c in totals.index[:MAX_PARTS] if c >= 0]
