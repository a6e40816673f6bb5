"""The allocations' lifetimes across the steps' phases, for what the bytes are (byte_classes.py,
which states the rules): one process's steps and phase windows (`StepPhases`), each moment's
phase as a lookup in a table of the times where it can change (`Regions`), each allocation's
class by both rules (`classify`, and `classify_regions` for the many freed before the steps end),
the moments to class (`Heights`) and the bytes live at them by class (`Lifetimes`).

At 1e7 events the reducer classes 5 million allocations: a moment's phase costs one binary search
in the table instead of one in the steps plus four windows' tests, and an allocation freed before
the last step ends (all but a few) is classed from a handful of table columns, not from the
whole rule set (docs/performance.md, "What the bytes are at 1e7 events").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..model.bytes import BYTE_CLASSES

WEIGHTS, ACTIVATIONS, GRADIENTS, OPTIMIZER, WORKSPACES, CACHE, OTHER = range(len(BYTE_CLASSES))
N_CLASSES = len(BYTE_CLASSES)
HIGH = np.iinfo("int64").max
# phase codes of a moment
BEFORE, FORWARD, BACKWARD, OPTIMIZER_PHASE, IN_STEP, BETWEEN, AFTER = range(7)
PHASE_NAMES = (("forward", FORWARD), ("backward", BACKWARD), ("optimizer", OPTIMIZER_PHASE))


@dataclass
class Regions:
    """StepPhases.phase_of as a table: `bounds` (ascending) are every time at which one of its
    answers can change (a step's start, a step's end + 1, a phase window's start and end + 1, and 1:
    an allocation made at 0 or before was live when a late capture began), so every time of one
    region (searchsorted(bounds, ts, "right"): 0 before bounds[0], i in [bounds[i-1], bounds[i]))
    has the same answers, worked out once from a time of it. Per region: the step and phase code
    (phase_of's), and what classify_regions reads of an allocation made there (`made_column`,
    `act_step`, `grad_lo`, `grad_hi`, `pair`) or of a free there (`bwd_step`)."""

    bounds: np.ndarray
    step: np.ndarray
    code: np.ndarray
    made_column: np.ndarray  # 1 + the step an allocation made here counts as made in (0: none)
    act_step: np.ndarray  # its step where a forward made it (-2 elsewhere): an activation if freed in that backward
    bwd_step: np.ndarray  # the step whose backward a free here is in (-3 elsewhere)
    grad_lo: np.ndarray  # made in a backward: a gradient if freed in regions [grad_lo, grad_hi)
    grad_hi: np.ndarray
    pair: np.ndarray  # of an allocation made here and not kept: its pair of classes (pair_of), exact other
    end_last: int  # the last step's end: freed after it, an allocation is kept

    def of(self, ts: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds, ts, side="right")


@dataclass
class StepPhases:
    """One process's steps (in time order) and each step's phase windows (-1: none)."""

    names: list
    start: np.ndarray
    end: np.ndarray
    phase: dict  # "forward" | "backward" | "optimizer" -> (starts, ends)
    table: Optional[Regions] = field(default=None, repr=False, compare=False)

    def phase_of(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each moment's step index (the last step started by then, -1 before the first) and phase code."""
        t = self.regions()
        at = t.of(ts)
        return t.step[at], t.code[at]

    def regions(self) -> Regions:
        if self.table is None:
            self.table = _regions(self)
        return self.table

    def rule(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """phase_of, from the steps and windows themselves (what the table is made of)."""
        k = np.searchsorted(self.start, ts, side="right") - 1
        at = np.maximum(k, 0)
        code = np.where(k < 0, BEFORE, np.where(ts <= self.end[at], IN_STEP, BETWEEN))
        code = np.where((k == len(self.start) - 1) & (ts > self.end[-1]), AFTER, code)
        for name, value in PHASE_NAMES:
            lo, hi = self.phase[name]
            inside = (k >= 0) & (lo[at] >= 0) & (ts >= lo[at]) & (ts <= hi[at])
            code = np.where(inside & (code == IN_STEP), value, code)
        return k, code


def _regions(p: StepPhases) -> Regions:
    last = len(p.start) - 1
    windows = [edge for lo, hi in p.phase.values() for edge in (lo, hi + 1)]
    bounds = np.unique(np.concatenate([p.start, p.end + 1, np.ones(1, "int64")] + windows).astype("int64"))
    points = np.concatenate([[bounds[0] - 1], bounds])  # a time of each region
    step, code = p.rule(points)
    early = points <= 0
    at = np.maximum(step, 0)
    back_end = p.phase["backward"][1][at]
    next_end = p.end[np.minimum(at + 1, last)]
    # f_ts > back_end and f_ts <= next_end, as regions: back_end + 1 and next_end + 1 are bounds
    grad = (code == BACKWARD) & ~early
    segment = np.full(len(points), OTHER, "int8")
    for phase, value in ((FORWARD, ACTIVATIONS), (BACKWARD, GRADIENTS), (OPTIMIZER_PHASE, OPTIMIZER)):
        segment[(code == phase) & ~early] = value
    return Regions(bounds=bounds, step=step, code=code,
                   made_column=np.where(np.isin(code, (BEFORE, BETWEEN, AFTER)) | early, -1, step) + 1,
                   act_step=np.where((code == FORWARD) & ~early, step, -2), bwd_step=np.where(code == BACKWARD, step, -3),
                   grad_lo=np.where(grad, np.searchsorted(bounds, back_end + 1, side="right"), len(bounds) + 1),
                   grad_hi=np.where(grad, np.searchsorted(bounds, next_end + 1, side="right"), 0),
                   pair=pair_of(np.full(len(points), OTHER), segment), end_last=int(p.end[last]))


def classify(p: StepPhases, a_ts: np.ndarray, f_ts: np.ndarray, outside: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each allocation's class (exact rules, segment-level rules) from its alloc and free times
    (HIGH: never freed in the capture) and whether it is outside a caching allocator
    (allocator.AllocatorRows: a library's block); see byte_classes.py's docstring. Also each
    one's step (-1: made outside every step)."""
    last = len(p.start) - 1
    ak, ap = p.phase_of(a_ts)
    freed = f_ts < HIGH
    fk, fp = p.phase_of(np.where(freed, f_ts, 0))
    kept = ~freed | (f_ts > p.end[last])
    at = np.maximum(ak, 0)
    exact = np.full(len(a_ts), OTHER, "int8")
    exact[(ap == BEFORE) & kept] = WEIGHTS
    exact[(ap == FORWARD) & freed & (fp == BACKWARD) & (fk == ak)] = ACTIVATIONS
    back_end = p.phase["backward"][1][at]
    next_end = p.end[np.minimum(at + 1, last)]
    exact[(ap == BACKWARD) & ((freed & (f_ts > back_end) & (f_ts <= next_end) & ~kept)
                              | (kept & (ak == last)))] = GRADIENTS
    exact[(ap == OPTIMIZER_PHASE) & kept] = OPTIMIZER
    exact[(ak == 0) & np.isin(ap, (FORWARD, BACKWARD, IN_STEP)) & kept & (exact == OTHER)] = WORKSPACES
    segment = np.full(len(a_ts), OTHER, "int8")
    segment[ap == FORWARD] = ACTIVATIONS
    segment[ap == BACKWARD] = GRADIENTS
    segment[ap == OPTIMIZER_PHASE] = OPTIMIZER
    segment[(ap == BEFORE) & kept] = WEIGHTS
    segment[kept & outside] = WORKSPACES
    early = a_ts <= 0  # live when a late capture began (capture_start.py): made who knows where
    exact[early], segment[early] = OTHER, OTHER
    return exact, segment, np.where(np.isin(ap, (BEFORE, BETWEEN, AFTER)) | early, -1, ak)


def pair_of(exact: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The pair of an allocation's classes by both rules, as Lifetimes sums them."""
    return exact.astype("int64") * N_CLASSES + segment


def classify_regions(t: Regions, made: np.ndarray, freed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """classify's answers for allocations freed by the last step's end (not kept: no weights,
    optimizer state or workspaces, and the outside judgement is not read), from the regions
    (Regions.of) of their alloc and free times: each one's pair of classes (pair_of) and its
    made_column. Exact classes: other, but activations made in a forward and freed in that
    step's backward, gradients made in a backward and freed after it by the next step's end."""
    pair = t.pair[made]
    np.subtract(pair, (OTHER - ACTIVATIONS) * N_CLASSES, out=pair, where=t.act_step[made] == t.bwd_step[freed])
    np.subtract(pair, (OTHER - GRADIENTS) * N_CLASSES, out=pair,
                where=(freed >= t.grad_lo[made]) & (freed < t.grad_hi[made]))
    return pair, t.made_column[made]


@dataclass
class Heights:
    """First reducer: per (process, device) series, the first event at its highest live bytes, and
    per step the first event at the step's highest (or, a step without events, the last before it)."""

    phases: dict[int, StepPhases]
    best: dict = field(default_factory=dict)  # (pid, device) -> [live, seq, ts]
    steps: dict = field(default_factory=dict)  # (pid, device) -> arrays live, seq, ts, before_seq, before_ts

    def add(self, pid: int, device: int, seq: np.ndarray, rows: np.ndarray, ts: np.ndarray, live: np.ndarray) -> None:
        """A batch's events of one series: `rows` (in time order) of the batch's `seq`, their
        times and running live bytes."""
        p = self.phases.get(pid)
        if p is None or not len(rows):
            return
        key = (pid, device)
        at = int(np.argmax(live))
        if key not in self.best or live[at] > self.best[key][0]:
            self.best[key] = [int(live[at]), int(seq[rows[at]]), int(ts[at])]
        n = len(p.start)
        if key not in self.steps:
            self.steps[key] = {"live": np.full(n, np.iinfo("int64").min), "seq": np.full(n, -1), "ts": p.start.copy(),
                               "before": np.full(n, -1)}
        s = self.steps[key]
        before = np.searchsorted(ts, p.start, side="left") - 1  # this batch's last event before each step
        has = before >= 0
        s["before"][has] = seq[rows[before[has]]]
        first, high = _window_highs(ts, live, p.start, p.end)
        better = np.flatnonzero((first >= 0) & (high > s["live"]))
        chosen = first[better]
        s["live"][better], s["seq"][better], s["ts"][better] = live[chosen], seq[rows[chosen]], ts[chosen]

    def queries(self, key: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The moments to class (the peak, then each step's): event seqs (-1: before any event,
        nothing live), their times, and the steps' indices (-1 for the peak)."""
        live, seq, ts = self.best[key]
        s = self.steps[key]
        step_seq = np.where(s["seq"] >= 0, s["seq"], s["before"])
        return (np.concatenate([[seq], step_seq]).astype("int64"), np.concatenate([[ts], s["ts"]]).astype("int64"),
                np.arange(-1, len(step_seq)))


def _window_highs(ts: np.ndarray, live: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per window [start, end] (in time order, apart), the first row at its highest live bytes
    (-1 when no row is inside) and that height: the rows of a window are one slice of the
    time-ordered rows, so no sort (at 1e7 events and 5,000 steps, a lexsort took seconds)."""
    lo = np.searchsorted(ts, start, side="left")
    hi = np.maximum(np.searchsorted(ts, end, side="right"), lo)
    counts = hi - lo
    first = np.full(len(start), -1, "int64")
    high = np.full(len(start), np.iinfo("int64").min, "int64")
    has = np.flatnonzero(counts > 0)
    if not len(has):
        return first, high
    bounds = np.stack([lo[has], hi[has]], 1).ravel()
    if (np.diff(bounds) < 0).any():  # overlapping windows: one at a time
        for k in has.tolist():
            at = lo[k] + int(np.argmax(live[lo[k]:hi[k]]))
            first[k], high[k] = at, live[at]
        return first, high
    # the rows from the first window's start to the last one's end, cut at every window's start
    # and end: windows and the gaps between them, each window's highest by reduceat
    span = live[:bounds[-1]]
    high[has] = np.maximum.reduceat(span, bounds[:-1])[::2]
    # each row of the span against its window's highest (a gap's rows against the window's before
    # it: the first match at or after a window's start is in it, as its highest is)
    heights = np.repeat(np.repeat(high[has], 2)[:-1], np.diff(bounds))
    hits = bounds[0] + np.flatnonzero(span[bounds[0]:] == heights)
    first[has] = hits[np.searchsorted(hits, lo[has], side="left")]
    return first, high


@dataclass
class Lifetimes:
    """Second reducer: each allocation's bytes, classed by both rules, added to the moments of
    `heights` it is live at (alloc seq <= moment < free seq), as difference arrays, and to the step
    that made it. Both are summed by pair of classes (exact * N_CLASSES + segment-level: one
    sum for both rules), each rule's sums being the pairs' summed over the other rule."""

    heights: Heights
    sums: dict = field(default_factory=dict)  # (pid, device) -> int64 [N_CLASSES ** 2, moments + 1]
    made: dict = field(default_factory=dict)  # (pid, device) -> int64 [N_CLASSES ** 2, steps + 1] (column 0: none)
    moments: dict = field(default_factory=dict)
    sorted_moments: dict = field(default_factory=dict)

    def tracks(self, pid: int, device: int) -> bool:
        """Whether the series has moments to class (else what is added to it is dropped)."""
        key = (pid, device)
        if key not in self.heights.best:
            return False
        if key not in self.moments:
            moments = self.moments[key] = self.heights.queries(key)
            self.sorted_moments[key] = np.sort(moments[0], kind="stable")
            self.sums[key] = np.zeros((N_CLASSES ** 2, len(moments[0]) + 1), "int64")
            self.made[key] = np.zeros((N_CLASSES ** 2, len(self.heights.phases[pid].start) + 1), "int64")
        return True

    def places(self, pid: int, device: int, rows: np.ndarray, ts: np.ndarray, seq0: int) -> tuple[np.ndarray, np.ndarray]:
        """Of a tracked series' events, `rows` (ascending) of a batch whose times are `ts` (in time
        order) and seqs seq0, seq0 + 1, ...: each one's region of the phases (Regions.of) and its
        place among the sorted moments (how many are before it), found from where each bound falls
        among them (tens of thousands of binary searches, not millions, and no gather)."""
        bounds = self.heights.phases[pid].regions().bounds
        return (_counted(np.searchsorted(rows, np.searchsorted(ts, bounds, side="left"), side="left"), len(rows)),
                _counted(np.searchsorted(rows, self.sorted_moments[(pid, device)] - seq0, side="right"), len(rows)))

    def add(self, pid: int, device: int, a_seq: np.ndarray, a_ts: np.ndarray, f_seq: np.ndarray, f_ts: np.ndarray,
            size: np.ndarray, outside: Optional[np.ndarray]) -> None:
        """Allocations of one (process, device): never freed ones with f_seq = f_ts = HIGH;
        `outside`: whether each is outside a caching allocator (allocator.AllocatorRows),
        read only for those kept after the last step (None when there is none)."""
        if not len(a_seq) or not self.tracks(pid, device):
            return
        p = self.heights.phases[pid]
        t = p.regions()
        pair, column = classify_regions(t, t.of(a_ts), t.of(f_ts))
        kept = np.flatnonzero(f_ts > t.end_last)
        if len(kept):  # the few kept after the last step: every rule
            exact, segment, step = classify(p, a_ts[kept], f_ts[kept], outside[kept])
            pair[kept], column[kept] = pair_of(exact, segment), step + 1
        moments = self.sorted_moments[(pid, device)]
        self._sum((pid, device), pair, column, np.searchsorted(moments, a_seq, side="left"),
                  np.searchsorted(moments, f_seq, side="left"), size)

    def add_places(self, pid: int, device: int, a_region: np.ndarray, f_region: np.ndarray, a_moment: np.ndarray,
                   f_moment: np.ndarray, size: np.ndarray) -> None:
        """Allocations of a tracked series freed by the last step's end, by their alloc's and
        free's `places`."""
        if len(size):
            self._sum((pid, device), *classify_regions(self.heights.phases[pid].regions(), a_region, f_region),
                      a_moment, f_moment, size)

    def _sum(self, key: tuple, pair: np.ndarray, column: np.ndarray, a_moment: np.ndarray, f_moment: np.ndarray,
             size: np.ndarray) -> None:
        """Each allocation's bytes (by its pair of classes) to the step that made it (its made
        column), and to the moments [a_moment, f_moment) (places among the sorted moments) it is
        live at."""
        # np.add.at on the cells touched, in int64 (exact): a bincount with the whole grid
        # (49 pairs x steps or moments) as its length cost every call the grid, which grows with
        # the capture (at 1e7 events 277 calls on the streamed batches); numpy >= 1.25's
        # add.at is no slower than one bincount even for a million allocations
        size = size.astype("int64", copy=False)
        made = self.made[key]
        np.add.at(made.reshape(-1), pair * made.shape[1] + column, size)
        sums = self.sums[key]
        # an allocation live at no moment (alloc and free between the same two: half of them at
        # 1e7 events) adds and takes away its bytes at one cell: left out
        spans = np.flatnonzero(a_moment != f_moment)
        at, size = pair[spans] * sums.shape[1], size[spans]
        np.add.at(sums.reshape(-1), at + a_moment[spans], size)
        np.add.at(sums.reshape(-1), at + f_moment[spans], -size)

    def by_rule(self, pairs: np.ndarray, level: str) -> np.ndarray:
        """[N_CLASSES, ...] of sums by pair of classes: the exact rule's or the segment-level's."""
        split = pairs.reshape(N_CLASSES, N_CLASSES, -1)
        return split.sum(axis=1) if level == "exact" else split.sum(axis=0)

    def made_by(self, key: tuple, level: str) -> np.ndarray:
        """[N_CLASSES, steps] bytes each step made, by class."""
        return self.by_rule(self.made[key], level)[:, 1:]

    def at_moments(self, key: tuple, level: str) -> np.ndarray:
        """[N_CLASSES, moments] bytes live at each moment of `key`, in the moments' own order."""
        moments, times, _ = self.moments[key]
        order = np.argsort(moments, kind="stable")
        in_order = np.cumsum(self.by_rule(self.sums[key], level), axis=1)[:, :-1]
        result = np.empty_like(in_order)
        result[:, order] = in_order
        return result


def _counted(first: np.ndarray, n: int) -> np.ndarray:
    """For each of n rows, how many of the ascending `first` (the first row each bound holds
    for) are at or before it."""
    return np.repeat(np.arange(len(first) + 1, dtype="int32"), np.diff(first, prepend=0, append=n))
