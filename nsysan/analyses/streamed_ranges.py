"""The NVTX sections of the streamed full analysis (streamed_full.py), equal to the whole frame's:
range_stats per range name, and the timeline's bands, spans, trace ends and focus
(timeline.top_level_bands, explore.nvtx_spans, early_trace_ends, focus_window).

The ranges are read whole; of the events these need only:
- the threads with memory events (first pass, RangeThreads), for the bands and the spans;
- the highest GPU-resident live bytes of a range's process while the range was open (first
  pass, RangeThreads: windows over each process's live series, windows.py);
- per range name, the allocations and the bytes allocated and freed inside it (each event's
  innermost user range and operator, as SiteSums attributes them batch by batch), and the bytes
  allocated inside it and never freed (the allocations closed and those live at the end: their
  ranges are what SiteSums keeps of them); second pass, RangeSums;
- for the focus, the memory movement (sum of |delta bytes|) before the steps start and up to
  their end, known once the bands are (second pass, RangeSums).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..events.nvtx import range_paths, thread_key
from ..model import RangeFamily, RangeStat
from .ranges import nested_sums, ranked_ranges, range_spans
from .streamed import FirstLook
from .streamed_sites import SiteSums
from .windows import Windows

MOVED = ("allocations", "allocated", "freed", "open")  # ranges._moved_inside's columns
FINITE = np.iinfo("int64").max // 4  # as analyses._capture_span: times from here on are absurd


class RangeThreads:
    """The first pass's consumer after FirstLook: the threads with memory events, and the windows
    of each range instance (user ranges then operator ranges, as range_spans lists them) over its
    process's GPU-resident live bytes."""

    def __init__(self, look: FirstLook, ranges: pd.DataFrame, operator_ranges: pd.DataFrame, end_ns: int) -> None:
        """`end_ns`: the capture's end as far as it is known before the events (the duration, the
        calls' and ranges' ends). The whole frame ends each range by the capture's end, which is
        past every event of a finite time (below FINITE); ranges ending by the later of `end_ns`
        and FINITE then hold the same events: all but those of absurd times, as there."""
        self.look = look
        self.keys = np.zeros(0, "int64")  # thread_key of each thread with events
        spans = range_spans(ranges, operator_ranges, max(end_ns, FINITE - 1))
        self.start, self.end = spans["start_ns"].to_numpy(), spans["end_ns"].to_numpy()
        self.windows = Windows()
        self.window_ids = np.full(len(spans), -1, "int64")  # of each range instance, -1 for none yet
        pid = spans["pid"].to_numpy().astype("int64")
        self.by_pid = {int(p): np.flatnonzero(pid == p) for p in pd.unique(pid).tolist()}  # one per process
        self.opened = 0  # processes (FirstLook.cut codes) whose windows are open

    def add(self, b) -> None:
        if len(b) == 0:
            return
        self.keys = pd.unique(np.concatenate([self.keys, thread_key(b.pid, b.calls["tid"])]))
        resident = self.look.batch_live.get("resident")
        if resident is None:
            return
        cut = self.look.cut
        if len(cut.index) > self.opened:  # a process's first GPU-resident events: its ranges' windows
            for pid, code in list(cut.index.items())[self.opened:]:
                mine = self.by_pid.get(int(pid))
                if mine is not None and len(mine):
                    self.window_ids[mine] = self.windows.open(code, self.start[mine], self.end[mine])
            self.opened = len(cut.index)
        rows, codes, live = resident
        self.windows.add(codes, b.ts[rows], live)

    def threads(self) -> pd.DataFrame:
        """The threads with memory events, as a frame of pid and tid (what top_level_bands and
        nvtx_spans read of the events)."""
        return pd.DataFrame({"pid": self.keys >> 24, "tid": self.keys & 0xFFFFFF})

    def max_live(self) -> np.ndarray:
        """ranges._max_live_while_open: of each range instance, the most GPU-resident bytes its
        process held while it was open (the value carried in at its start, or after an event
        inside); 0 for a process without such events."""
        self.windows.finish()
        result = np.zeros(len(self.window_ids), "int64")
        has = np.flatnonzero(self.window_ids >= 0)
        ids = self.window_ids[has]
        result[has] = np.maximum(self.windows.at_start[ids], self.windows.high_after[ids])
        return result


class RangeSums:
    """The second pass's consumer, a watcher of SiteSums (whose attribution of each event to its
    ranges it reads): per range name what moved inside (ranges._moved_inside), and the movement before
    and through `steps` (explore.focus_from_movement's `moved_between`)."""

    def __init__(self, sites: SiteSums, ranges: pd.DataFrame, steps: Optional[tuple[int, int]]) -> None:
        self.sites = sites
        # range row -> name code as attribute_ranges' categories number them (row -1: "")
        names = ranges["name"].to_numpy(dtype=object) if not ranges.empty else np.zeros(0, object)
        self.user_code, self.user_names = pd.factorize(np.append(names, ""))
        self.user = np.zeros((len(MOVED), len(self.user_names)), "int64")
        # range row -> code of its NVTX path (events.nvtx.range_paths; row -1: ""), for nested_sums
        self.ranges = ranges
        self.path_code, self.path_names = pd.factorize(np.append(range_paths(ranges) if not ranges.empty
                                                                 else np.zeros(0, object), ""))
        self.path = np.zeros((2, len(self.path_names)), "int64")  # allocations, bytes allocated per path
        self.operator = np.zeros((len(MOVED), len(sites.operator_names)), "int64")
        self.open_strings = {"nvtx_range": {}, "operator": {}}  # SiteSums string code -> bytes never freed
        self.steps = steps
        self.moved = self.before_start = self.through_end = 0.0
        sites.watchers.append(self)  # fed inside SiteSums.add, with what it knows of the allocations

    def add(self, b, known: dict) -> None:
        if len(b) == 0:
            return
        nvtx, operator = self.sites.batch_ranges
        allocs = np.flatnonzero(b.is_alloc)
        frees = np.flatnonzero(~b.is_alloc & (b.partner_seq >= 0))  # a free of an allocation seen
        sums = [(self.user, self.user_code[nvtx])]
        if self.operator.shape[1] > 1:
            sums.append((self.operator, operator))
        for table, code in sums:
            np.add.at(table[0], code[allocs], 1)
            np.add.at(table[1], code[allocs], b.bytes[allocs])
            np.add.at(table[2], code[frees], b.bytes[frees])
        path = self.path_code[nvtx[allocs]]
        np.add.at(self.path[0], path, 1)
        np.add.at(self.path[1], path, b.bytes[allocs])
        closed = b.closed.get("seq", np.zeros(0, "int64"))
        if len(closed):  # never to be freed: still live at the end, for the whole frame
            self._never_freed({c: known[c][np.searchsorted(known["seq"], closed)] for c in self.open_strings},
                              b.closed["bytes"])
        if self.steps is not None:
            self._movement(b)

    def finish(self, live: dict) -> None:
        """The allocations live at the end (EventFlow.live) were never freed: after SiteSums.finish."""
        if len(live["seq"]):
            at = np.searchsorted(self.sites.live["seq"], live["seq"])
            self._never_freed({c: self.sites.live[c][at] for c in self.open_strings}, live["bytes"])

    def moved_inside(self) -> pd.DataFrame:
        """ranges._moved_inside per user range name, then per operator name, summed by name."""
        strings = list(self.sites.strings)
        parts = []
        for table, names, column in ((self.user, self.user_names, "nvtx_range"),
                                     (self.operator, self.sites.operator_names, "operator")):
            frame = pd.DataFrame(table.T.copy(), index=pd.Index(names, dtype=object), columns=list(MOVED))
            opened = pd.Series({strings[code]: size for code, size in self.open_strings[column].items()},
                               dtype="int64")
            frame["open"] = opened.reindex(frame.index, fill_value=0).to_numpy().astype("int64")
            parts.append(frame)
        user, operator = parts
        if len(operator) <= 1:  # no operator ranges: "" alone
            return user
        moved = pd.concat([user, operator.drop(index="", errors="ignore")])
        return moved.groupby(level=0, sort=False).sum()

    def nested(self) -> pd.DataFrame:
        """ranges.nested_sums from the allocations summed per NVTX path."""
        by_path = pd.DataFrame({"allocations": self.path[0], "allocated": self.path[1]},
                               index=pd.Index(self.path_names, dtype=object))
        return nested_sums(by_path, self.ranges)

    def moved_between(self, start: int, end: int) -> float:
        """The movement of the events from the steps' `start` to their `end`, both included."""
        assert (start, end) == self.steps, "the movement was summed for the steps alone"
        return self.through_end - self.before_start

    def _never_freed(self, strings: dict, size: np.ndarray) -> None:
        for column, codes in strings.items():
            summed = pd.Series(size.astype("int64")).groupby(codes).sum()  # a few names per batch
            kept = self.open_strings[column]
            for code, total in summed.items():
                kept[int(code)] = kept.get(int(code), 0) + int(total)

    def _movement(self, b) -> None:
        """The running movement (explore.focus_window's cumulative sum, in the same order, so the
        same floats) at the last moving event before the steps' start and at or before their end."""
        moving = np.flatnonzero(b.delta != 0)
        if not len(moving):
            return
        ts = b.ts[moving]
        moved = np.abs(b.delta[moving].astype("float64"))
        moved = np.cumsum(np.concatenate([[self.moved], moved]))
        start, end = self.steps
        before = int(np.searchsorted(ts, start, side="left"))
        if before:
            self.before_start = float(moved[before])
        through = int(np.searchsorted(ts, end, side="right"))
        if through:
            self.through_end = float(moved[through])
        self.moved = float(moved[-1])


def streamed_range_stats(ranges: pd.DataFrame, operator_ranges: pd.DataFrame, end_ns: int, threads: RangeThreads,
                         sums: RangeSums) -> tuple[list[RangeStat], list[RangeFamily]]:
    """range_stats from the passes' sums. Sizes are always known here: an export without the
    memory-usage table has no events to stream, so there are no allocation calls to count."""
    if ranges.empty and operator_ranges.empty:
        return [], []
    return ranked_ranges(range_spans(ranges, operator_ranges, end_ns), threads.max_live(), sums.moved_inside(), None,
                         nested=sums.nested())
