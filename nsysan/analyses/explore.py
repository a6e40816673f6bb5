"""What a reader needs to explore the timeline and to read summaries instead of long lists.

- where memory moves: the span a page opens on (a 9.5 s flat setup should not squeeze the steps
  into the last 6% of the axis);
- the NVTX ranges of each process's main thread at every depth, for the path under the cursor;
- the largest allocations with their lifetimes, for "what was live at this moment";
- where a process's CUDA trace stops early, for a marker;
- allocations grouped by process, site and NVTX range: count, total, size range.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import numpy as np
import pandas as pd

from ..engine import Facts, Reducer
from ..events.arrays import category_codes, distinct_rows
from ..events.batch import EventBatch
from ..events.columns import empty_ranges
from ..events.nvtx import thread_key
from ..events.read import TRACE_GOES_ON
from ..model import AllocationGroup, Band, NvtxSpan, TraceEnd
from ..model.memory import range_family, site_in_family
from .capture import FINITE
from .sites import call_site
from .steps import STEP_WORDS
from .timeline import longest_per_process, top_level_bands

MAX_SPANS = 2000
MAX_OPERATOR_SPANS = 2000
MAX_INTERVALS = 300
LARGEST_COLUMNS = ("seq", "ts", "pid", "device", "kind", "address", "bytes")  # what LargestAllocations keeps
MAX_GROUPS = 100
# The focus starts once this share of all memory movement (sum of |delta bytes|) has happened: a
# setup's few small allocations long before the steps are left out of the first view.
FOCUS_SKIP = 0.05
FOCUS_PAD = 0.03  # of the focus span, on each side
WARM_UP_AFTER = 3  # later steps a process needs for its first one to be left out of the focus (after_warm_up)

_NO_RANGES = empty_ranges()
STEP_REPEATS = 3
_NUMBER = re.compile(r"\d+")


def step_bands(bands: list[Band]) -> list[Band]:
    """The bands that look like training steps: the most repeated outermost range name that
    differs only by a number ("step 3", "iteration 12", "ProfilerStep#7") or names a step, with at
    least STEP_REPEATS instances in one process."""
    counts: dict[tuple[int, str], int] = {}
    for band in bands:
        pattern = _NUMBER.sub("#", band.name)
        if "#" in pattern or STEP_WORDS.search(band.name):
            counts[band.pid, pattern] = counts.get((band.pid, pattern), 0) + 1
    if not counts or max(counts.values()) < STEP_REPEATS:
        return []
    best = max(counts, key=lambda key: counts[key])[1]
    return [b for b in bands if _NUMBER.sub("#", b.name) == best]  # every process's steps


def after_warm_up(steps: list[Band]) -> Optional[int]:
    """Where the steps after the warm-up start: the latest end of each process's first step, when
    in every process that first step outlasts all its later steps together (at least
    WARM_UP_AFTER of them); else None.

    The first step is warm-up (the growth verdict leaves it out too: growth.py), and in PyTorch it
    is often ten times longer than the steps after it (cuDNN, cuBLAS and NCCL set up, the caching
    allocator fills): opened on every step, the page gave it 80-90% of its width and squeezed the
    steps where a leak shows as a staircase into the rest."""
    by_pid: dict[int, list[Band]] = {}
    for band in steps:
        by_pid.setdefault(band.pid, []).append(band)
    ends = []
    for own in by_pid.values():
        own.sort(key=lambda band: (band.start_ns, band.end_ns))
        first, later = own[0], own[1:]
        if len(later) < WARM_UP_AFTER or any(band.end_ns >= FINITE for band in own) \
                or first.end_ns - first.start_ns <= sum(band.end_ns - band.start_ns for band in later):
            return None
        ends.append(first.end_ns)
    return max(ends) if ends else None


def nvtx_spans(ranges: pd.DataFrame, threads: pd.DataFrame, limit: int = MAX_SPANS) -> list[NvtxSpan]:
    """Ranges of each process's main thread (tid == pid), all depths, in time order; the longest
    `limit` when there are more (`threads`: the pid column of the threads with memory events)."""
    return spans(ranges[(ranges["tid"] == ranges["pid"]).to_numpy()], threads, limit)


def spans(mine: pd.DataFrame, threads: pd.DataFrame, limit: int) -> list[NvtxSpan]:
    """The ranges of the processes with events (all, without events), the longest `limit` shared
    among the processes (longest_per_process), in time order: the page draws a span once it is a
    pixel wide, so the longest are the ones a zoom shows first."""
    if not threads.empty:
        mine = mine[mine["pid"].isin(pd.unique(threads["pid"].to_numpy())).to_numpy()]  # a hash pass, not a sort
    mine = longest_per_process(mine, limit).sort_values(["start_ns", "depth"], kind="stable")
    return [NvtxSpan(int(p), int(t), str(n), int(s), int(e), int(d))
            for p, t, n, s, e, d in mine[["pid", "tid", "name", "start_ns", "end_ns", "depth"]]
            .itertuples(index=False)]  # capped list


class Explorable(Reducer):
    """What the timeline's explorable parts read of the events: the threads with memory events,
    whose NVTX ranges (Facts.more's) make the bands and spans, and where memory moves (the focus
    window). The first look gathers the threads and sums the movement (|delta bytes|, one
    running sum in event order, so the same floats however the batches are cut); between the
    looks the bands are made, and the second look finds where FOCUS_SKIP of the movement had
    happened and how much moved inside the steps (step_bands). Its answer: itself (finish)."""

    field = "explorable"
    needs = ("nvtx_ranges", "operator_ranges")
    second_look = True

    def start(self, facts: Facts) -> None:
        super().start(facts)
        self.ranges = facts.more.get("nvtx_ranges", _NO_RANGES)
        self.operators = facts.more.get("operator_ranges", _NO_RANGES)
        self.keys = np.zeros(0, "int64")  # thread_key of each thread with events (when there are ranges)
        self.moved, self.last_ts = 0.0, None

    def add(self, b: EventBatch) -> None:
        if len(b) and not (self.ranges.empty and self.operators.empty):
            self.keys = pd.unique(np.concatenate([self.keys, thread_key(b.pid, b.calls["tid"])]))
        ts, moved = _movement(b, self.moved)
        if len(ts):
            self.moved, self.last_ts = float(moved[-1]), int(ts[-1])

    def between(self) -> None:
        self.threads = pd.DataFrame({"pid": self.keys >> 24, "tid": self.keys & 0xFFFFFF})
        self.bands = top_level_bands(self.ranges, self.threads)
        steps = step_bands(self.bands)
        # from the first step's start to the last one's end
        self.steps = (min(b.start_ns for b in steps), max(b.end_ns for b in steps)) if steps else None
        self.running, self.first_ts = 0.0, None
        self.before_steps = self.through_steps = 0.0  # the movement before the steps' start, through their end

    def again(self, b: EventBatch) -> None:
        if self.first_ts is not None and self.steps is None:
            return
        ts, moved = _movement(b, self.running)
        if not len(ts):
            return
        if self.first_ts is None:
            at = int(np.searchsorted(moved, FOCUS_SKIP * self.moved, side="left"))
            self.first_ts = int(ts[at]) if at < len(ts) else None
        if self.steps is not None:
            before = int(np.searchsorted(ts, self.steps[0], side="left"))
            through = int(np.searchsorted(ts, self.steps[1], side="right"))
            self.before_steps = float(moved[before - 1]) if before else self.before_steps
            self.through_steps = float(moved[through - 1]) if through else self.through_steps
        self.running = float(moved[-1])

    def finish(self, live: dict) -> "Explorable":
        """Itself, whose `timeline()` adds what it found to the timeline: the threads with memory
        events (pid, tid), the NVTX bands, and the memory movement: in all (`moved`), where
        FOCUS_SKIP of it had happened (`first_ts`), the last event that moved memory (`last_ts`,
        None: none did) and what moved in the `steps`' span."""
        return self

    def timeline(self, timeline, trace_ends: list[TraceEnd]):
        """`timeline` with its bands, focus window, NVTX and operator spans, and `trace_ends`
        (early_trace_ends)."""
        start, end = self.focus(trace_ends)
        return dataclasses.replace(timeline, bands=self.bands, trace_ends=trace_ends, focus_start_ns=start,
                                   focus_end_ns=end, spans=nvtx_spans(self.ranges, self.threads),
                                   # PyTorch's operator ranges on every thread (an autograd thread runs the
                                   # backward pass's), at their depth among operators
                                   operator_spans=spans(self.operators, self.threads, MAX_OPERATOR_SPANS))

    def focus(self, trace_ends: list[TraceEnd]) -> tuple[Optional[int], Optional[int]]:
        """The span where memory moves, in ns ((None, None) without events that move memory): the
        steps when there are (step_bands; from the end of a first step that outlasts the rest:
        after_warm_up) and at least FOCUS_SKIP of the memory movement happens inside them, else
        from where FOCUS_SKIP of the movement had happened to the last event that moves memory;
        widened to the NVTX bands it cuts (whole steps), and to the ranges that follow an early
        end of the CUDA trace (`trace_ends`)."""
        if self.last_ts is None:
            return None, None
        first, last = self.first_ts if self.first_ts is not None else self.last_ts, self.last_ts
        # Steps where memory hardly moves (a framework that reserved it all before them) are not
        # where it moves: the movement rule stands.
        if self.steps is not None and self.through_steps - self.before_steps >= FOCUS_SKIP * self.moved:
            steady = after_warm_up(step_bands(self.bands))
            first, last = self.steps[0] if steady is None else steady, self.steps[1]
        for band in self.bands:  # whole bands: a step cut in two reads as a different step
            if band.start_ns < first < band.end_ns:
                first = band.start_ns
            if band.start_ns < last < band.end_ns:
                last = band.end_ns
        cut_short = {end.pid for end in trace_ends}
        later = [b.end_ns for b in self.bands if b.pid in cut_short]
        if later:  # show what went on after the trace stopped
            last = max(last, max(later))
        pad = int(FOCUS_PAD * (last - first)) if last > first else 1_000_000
        return first - pad, last + pad


def _movement(b: EventBatch, before: float) -> tuple[np.ndarray, np.ndarray]:
    """The times of the batch's events that move memory and the movement (sum of |delta bytes|)
    through each, `before` it included: a running sum in event order, added to as the whole
    frame's would be (`before` added to the first), in place (one array of floats)."""
    moving = np.count_nonzero(b.delta)
    if moving == len(b.delta):  # every event moves memory: no list of rows, no copy of the times
        ts, moved = b.ts, b.delta.astype("float64")
    else:
        rows = np.flatnonzero(b.delta)
        ts, moved = b.ts[rows], b.delta[rows].astype("float64")
    if len(moved):
        np.abs(moved, out=moved)
        moved[0] += before
        np.cumsum(moved, out=moved)
    return ts, moved


class LargestAllocations(Reducer):
    """The `limit` largest allocations (largest first, then earliest), kept batch by batch as a
    top-K merged with each batch's own, and how many allocations there were. Its answer: their
    rows (seq, ts, pid, device, kind, address, bytes) and the count."""

    field = "largest"

    def __init__(self, limit: int = MAX_INTERVALS) -> None:
        self.limit = limit

    def start(self, facts: Facts) -> None:
        super().start(facts)
        self.rows = {c: np.zeros(0, "uint64" if c == "address" else "int64") for c in LARGEST_COLUMNS}
        self.count = 0

    def add(self, b: EventBatch) -> None:
        allocs = np.flatnonzero(b.is_alloc)
        self.count += len(allocs)
        if len(allocs) > self.limit:  # a partial selection first: 1e7 events are not sorted for 300 rows
            allocs = allocs[largest_first(b.bytes[allocs], self.limit)]
        kept = {c: np.concatenate([self.rows[c], getattr(b, c)[allocs]]) for c in LARGEST_COLUMNS}
        order = np.lexsort((kept["seq"], -kept["bytes"]))[:self.limit]
        self.rows = {c: values[order] for c, values in kept.items()}

    def finish(self, live: dict) -> tuple[pd.DataFrame, int]:
        return pd.DataFrame(self.rows), self.count


def largest_first(values: np.ndarray, count: int) -> np.ndarray:
    """Positions of the `count` largest values, the earliest of equal values first, in position
    order. A partition finds the count-th largest value, but which of several equal values it
    keeps is arbitrary: the ones at that value are taken by position, so that reading the events
    in batches (LargestAllocations) keeps the same ones."""
    if len(values) <= count:
        return np.arange(len(values))
    threshold = values[np.argpartition(-values, count - 1)[count - 1]]
    above = np.flatnonzero(values > threshold)
    return np.sort(np.concatenate([above, np.flatnonzero(values == threshold)[:count - len(above)]]))


def early_trace_ends(ranges: pd.DataFrame, last_cuda_call_ns: dict[int, int]) -> list[TraceEnd]:
    """Processes whose CUDA trace stops while NVTX ranges go on after it (the cuda_trace_incomplete
    diagnostic's rule), with the time of the last CUDA call."""
    finite = ranges[(ranges["end_ns"] < FINITE).to_numpy()]
    return [TraceEnd(int(pid), int(last)) for pid, last in sorted(last_cuda_call_ns.items())
            if int(((finite["pid"] == pid) & (finite["start_ns"] > last)).sum()) >= TRACE_GOES_ON]


def allocation_groups(events: pd.DataFrame, rows: np.ndarray, site_table: dict[str, dict],
                      limit: int = MAX_GROUPS) -> list[AllocationGroup]:
    """Alloc events `rows` grouped by (process, device, kind, site, NVTX range), ranges that differ
    only in their numbers as one family ("step N": one leak of every step is one row): count, total
    bytes, smallest and largest, first and last allocation time; largest total first. Families are
    formed over every row before the cap, so a row's numbers are exact however many steps there are."""
    # A groupby over numpy arrays: a peak's live allocations are grouped for each of thousands of
    # processes, where pandas' grouped aggregation cost 10 ms a call (2 of 3 minutes at 5,000).
    columns = [events["pid"].to_numpy()[rows], events["device"].to_numpy()[rows], category_codes(events["kind"])[rows],
               category_codes(events["site"])[rows], category_codes(events["nvtx_range"])[rows]]
    size, ts = events["bytes"].to_numpy()[rows].astype("int64"), events["ts_ns"].to_numpy()[rows]
    kinds, sites, names = (events[c].cat.categories for c in ("kind", "site", "nvtx_range"))
    pair, pair_rows = distinct_rows(columns[3], columns[4])  # each (site, range) once: few, even at 1e7 rows
    family_names: dict[tuple[str, str], int] = {}
    family_codes = np.array([family_names.setdefault(_family_of(sites, names, int(columns[3][r]), int(columns[4][r])),
                                                     len(family_names)) for r in pair_rows.tolist()], "int64")
    group, firsts = distinct_rows(*columns[:3], family_codes[pair])  # numbered in order of first appearance
    n = len(firsts)
    count = np.bincount(group, minlength=n)
    total = np.zeros(n, "int64")
    np.add.at(total, group, size)
    smallest, largest = np.full(n, np.iinfo("int64").max), np.full(n, np.iinfo("int64").min)
    np.minimum.at(smallest, group, size)
    np.maximum.at(largest, group, size)
    first, last = np.full(n, np.iinfo("int64").max), np.full(n, np.iinfo("int64").min)
    np.minimum.at(first, group, ts)
    np.maximum.at(last, group, ts)
    # how many (site, range) pairs each group joins
    members = np.bincount(group[distinct_rows(group, pair)[1]], minlength=n)
    # largest total first, then most allocations, then earliest; ties in order of first appearance
    chosen = np.lexsort((np.arange(n), first, -count, -total))[:limit]
    pid, device, kind, site, nvtx = (column[firsts] for column in columns)
    groups = []
    for g in chosen.tolist():  # capped list
        label = str(sites[site[g]]) if site[g] >= 0 else ""
        name = str(names[nvtx[g]]) if nvtx[g] >= 0 else ""
        where = call_site(label, site_table)
        if members[g] > 1:
            where = dataclasses.replace(where, label=site_in_family(label, name))
            name = range_family(name)
        groups.append(AllocationGroup(pid=int(pid[g]), device=int(device[g]), kind=str(kinds[kind[g]]), site=where,
                                      nvtx_range=name, count=int(count[g]), total_bytes=int(total[g]),
                                      min_bytes=int(smallest[g]), max_bytes=int(largest[g]),
                                      first_alloc_ns=int(first[g]), last_alloc_ns=int(last[g]),
                                      members=int(members[g])))
    return groups


def _family_of(sites: pd.Index, names: pd.Index, site: int, nvtx: int) -> tuple[str, str]:
    label = str(sites[site]) if site >= 0 else ""
    name = str(names[nvtx]) if nvtx >= 0 else ""
    return site_in_family(label, name), range_family(name)
