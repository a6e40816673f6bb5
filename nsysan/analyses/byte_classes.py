"""What the bytes are: weights, activations, gradients, optimizer state, workspaces and the
allocator's cache, from each allocation's lifetime across the steps' forward, backward and
optimizer phases (NVTX ranges, or analyses/iteration_phases.py's for steps found from kernels).

The rules (docs/analyses.md, "What the bytes are"), for one process's device + array allocations:
- weights: allocated before the first step, live until after the last;
- activations: allocated in a step's forward, freed in the same step's backward;
- gradients: allocated in a backward, freed after it by the next step's end (zero_grad), or
  kept when it is the last step's;
- optimizer state: allocated in an optimizer phase and kept past the last step;
- workspaces: allocated inside the first step (not in its optimizer) and kept past the last: a
  library's workspace made at its first call (cuBLAS's, PyTorch's for cuBLAS);
- other: temporaries freed in the phase that made them, and whatever no rule names.
Exact when every allocation is one tensor (no caching allocator). Under PyTorch's caching
allocator the allocations are its segments, so the classes are segment-level: a segment is what
the phase that made it needed (forward: activations, backward: gradients, optimizer: optimizer
state; a kept block outside the allocator, allocator.outside_allocator's: workspaces), and the forward's
segments hold no tensor outside forward and backward: there they are the cache.

One reducer (`ByteClassSums`, nsysan/engine) answers on both paths, the whole frame as one batch:
its first look finds the moments to class (`Heights`: each series' highest point and each step's,
from the running live bytes), its second adds each allocation's bytes, classed from its alloc and
free times, to the moments it is live at (`Lifetimes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..engine import Reducer
from ..model.bytes import BYTE_CLASSES, MADE, ByteClasses, BytesAt
from ..base.units import fmt_bytes
from .groups import batch_series
from .steps import MAX_LISTED, OPEN_END, STEP_KINDS
from .streamed_allocators import OUTSIDE, AllocatorRows

WEIGHTS, ACTIVATIONS, GRADIENTS, OPTIMIZER, WORKSPACES, CACHE, OTHER = range(len(BYTE_CLASSES))
N_CLASSES = len(BYTE_CLASSES)
HIGH = np.iinfo("int64").max
# the phases a step's child ranges name (torch's own habits and the kernel-found ones)
PHASES = {"forward": re.compile(r"^(forward|fwd)\b", re.I), "backward": re.compile(r"^(backward|bwd)\b", re.I),
          "optimizer": re.compile(r"^(optimi[sz]er|optim|opt[._ ]?step)\b", re.I)}
# phase codes of a moment
BEFORE, FORWARD, BACKWARD, OPTIMIZER_PHASE, IN_STEP, BETWEEN, AFTER = range(7)
EXACT_LABEL = "exact: no caching allocator"
POOL_LABEL = "exact: one block per tensor from a stream-ordered pool, its unused reserve not counted"
SEGMENT_LABEL = "segment-level: the caching allocator's blocks, not tensors"


@dataclass
class StepPhases:
    """One process's steps (in time order) and each step's phase windows (-1: none)."""

    names: list
    start: np.ndarray
    end: np.ndarray
    phase: dict  # "forward" | "backward" | "optimizer" -> (starts, ends)

    def phase_of(self, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each moment's step index (the last step started by then, -1 before the first) and phase code."""
        k = np.searchsorted(self.start, ts, side="right") - 1
        at = np.maximum(k, 0)
        code = np.where(k < 0, BEFORE, np.where(ts <= self.end[at], IN_STEP, BETWEEN))
        code = np.where((k == len(self.start) - 1) & (ts > self.end[-1]), AFTER, code)
        for name, value in (("forward", FORWARD), ("backward", BACKWARD), ("optimizer", OPTIMIZER_PHASE)):
            lo, hi = self.phase[name]
            inside = (k >= 0) & (lo[at] >= 0) & (ts >= lo[at]) & (ts <= hi[at])
            code = np.where(inside & (code == IN_STEP), value, code)
        return k, code


def step_phases(found: dict, ranges: pd.DataFrame) -> dict[int, StepPhases]:
    """Per process with steps (find_step_ranges + iterations: pid -> (family, spans)), its steps and
    phases from the ranges named forward / backward / optimizer inside them; only processes with a
    forward and a backward in some step (else activations and gradients cannot be told apart).
    A step still open at the end runs to the last time an event can have (as step_windows' do: the
    capture's end is not known before the streamed flow ends, and no event lies beyond it)."""
    result = {}
    for pid, (_, spans) in found.items():
        start = spans["start_ns"].to_numpy().astype("int64")
        raw = spans["end_ns"].to_numpy().astype("int64")
        end = np.maximum(np.where(raw < OPEN_END, raw, OPEN_END - 1), start)
        if not len(start) or ranges.empty:
            continue
        mine = ranges[ranges["pid"].to_numpy() == pid]
        # Each distinct name matched once (tens of thousands of ranges repeat a few hundred
        # names); a missing name (code -1) matches no phase.
        codes, distinct = pd.factorize(mine["name"])
        phase = {}
        for name, pattern in PHASES.items():
            hit = np.array([pattern.match(str(n)) is not None for n in distinct] + [False], bool)
            rows = mine[hit[codes]]
            lo, hi = np.full(len(start), -1, "int64"), np.full(len(start), -1, "int64")
            if len(rows):
                s, e = rows["start_ns"].to_numpy(), rows["end_ns"].to_numpy()
                k = np.searchsorted(start, s, side="right") - 1
                ok = (k >= 0) & (e <= end[np.maximum(k, 0)])
                # per step, its earliest start and latest end (numpy's ufunc.at, not a groupby: 10 ms less)
                first, last = np.full(len(start), np.iinfo("int64").max), np.full(len(start), np.iinfo("int64").min)
                np.minimum.at(first, k[ok], s[ok].astype("int64"))
                np.maximum.at(last, k[ok], e[ok].astype("int64"))
                held = np.zeros(len(start), bool)
                held[k[ok]] = True
                lo[held], hi[held] = first[held], last[held]
            phase[name] = (lo, hi)
        if ((phase["forward"][0] >= 0) & (phase["backward"][0] >= 0)).any():
            labels = spans["name"].astype(str).tolist() if "name" in spans else [f"step {i}" for i in range(len(start))]
            result[int(pid)] = StepPhases(labels, start, end, phase)
    return result


def classify(p: StepPhases, a_ts: np.ndarray, f_ts: np.ndarray, outside: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each allocation's class (exact rules, segment-level rules) from its alloc and free times
    (HIGH: never freed in the capture) and whether it is outside a caching allocator
    (allocator.outside_allocator: a library's block); see the module's docstring. Also each one's
    step (-1: made outside every step)."""
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


@dataclass
class Heights:
    """First reducer: per (process, device) series, the first event at its highest live bytes, and
    per step the first event at the step's highest (or, a step without events, the last before it)."""

    phases: dict[int, StepPhases]
    best: dict = field(default_factory=dict)  # (pid, device) -> [live, seq, ts]
    steps: dict = field(default_factory=dict)  # (pid, device) -> arrays live, seq, ts, before_seq, before_ts

    def add(self, pid: int, device: int, seq: np.ndarray, ts: np.ndarray, live: np.ndarray) -> None:
        p = self.phases.get(pid)
        if p is None or not len(seq):
            return
        key = (pid, device)
        at = int(np.argmax(live))
        if key not in self.best or live[at] > self.best[key][0]:
            self.best[key] = [int(live[at]), int(seq[at]), int(ts[at])]
        n = len(p.start)
        if key not in self.steps:
            self.steps[key] = {"live": np.full(n, np.iinfo("int64").min), "seq": np.full(n, -1), "ts": p.start.copy(),
                               "before": np.full(n, -1)}
        s = self.steps[key]
        before = np.searchsorted(ts, p.start, side="left") - 1  # this batch's last event before each step
        has = before >= 0
        s["before"][has] = seq[before[has]]
        first, high = _window_highs(ts, live, p.start, p.end)
        better = np.flatnonzero((first >= 0) & (high > s["live"]))
        chosen = first[better]
        s["live"][better], s["seq"][better], s["ts"][better] = live[chosen], seq[chosen], ts[chosen]

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
    padded = np.append(live, np.iinfo("int64").min)
    high[has] = np.maximum.reduceat(padded, bounds)[::2]
    offsets = np.concatenate([[0], np.cumsum(counts[has])])
    rows = np.arange(offsets[-1]) + np.repeat(lo[has] - offsets[:-1], counts[has])
    hits = np.flatnonzero(live[rows] == np.repeat(high[has], counts[has]))
    first[has] = rows[hits[np.searchsorted(hits, offsets[:-1], side="left")]]
    return first, high


@dataclass
class Lifetimes:
    """Second reducer: each allocation's bytes, classed by both rules, added to the moments of
    `heights` it is live at (alloc seq <= moment < free seq), as difference arrays per class, and
    to the step that made it."""

    heights: Heights
    sums: dict = field(default_factory=dict)  # (pid, device) -> (exact, segment): int64 [N_CLASSES, moments + 1]
    made: dict = field(default_factory=dict)  # (pid, device) -> (exact, segment): int64 [N_CLASSES, steps]
    moments: dict = field(default_factory=dict)

    def add(self, pid: int, device: int, a_seq: np.ndarray, a_ts: np.ndarray, f_seq: np.ndarray, f_ts: np.ndarray,
            size: np.ndarray, outside: np.ndarray) -> None:
        """Allocations of one (process, device): never freed ones with f_seq = f_ts = HIGH;
        `outside`: whether each is outside a caching allocator (allocator.outside_allocator)."""
        key = (pid, device)
        if key not in self.heights.best or not len(a_seq):
            return
        if key not in self.moments:
            self.moments[key] = self.heights.queries(key)
            n = len(self.moments[key][0])
            self.sums[key] = (np.zeros((N_CLASSES, n + 1), "int64"), np.zeros((N_CLASSES, n + 1), "int64"))
            steps = len(self.heights.phases[pid].start)
            self.made[key] = (np.zeros((N_CLASSES, steps), "int64"), np.zeros((N_CLASSES, steps), "int64"))
        exact, segment, step = classify(self.heights.phases[pid], a_ts, f_ts, outside)
        weight = size.astype("float64")  # sums below 2**53 bytes: exact in float64
        inside = step >= 0
        for made, classes in zip(self.made[key], (exact, segment)):
            # bincount, not np.add.at: millions of allocations at 1e7 events
            made += np.bincount(classes[inside].astype("int64") * made.shape[1] + step[inside], weight[inside],
                                made.size).astype("int64").reshape(made.shape)
        moments = self.moments[key][0]
        order = np.argsort(moments, kind="stable")
        sorted_moments = moments[order]
        # moments (in seq order) at which each allocation is live: [first >= a_seq, first >= f_seq)
        lo = np.searchsorted(sorted_moments, a_seq, side="left")
        hi = np.searchsorted(sorted_moments, f_seq, side="left")
        live = lo < hi
        if not live.any():
            return
        width = len(moments) + 1
        for sums, classes in zip(self.sums[key], (exact, segment)):
            index = classes[live].astype("int64") * width
            sums += (np.bincount(index + lo[live], weight[live], sums.size)
                     - np.bincount(index + hi[live], weight[live], sums.size)).astype("int64").reshape(sums.shape)

    def at_moments(self, key: tuple, level: str) -> np.ndarray:
        """[N_CLASSES, moments] bytes live at each moment of `key`, in the moments' own order."""
        moments, times, _ = self.moments[key]
        order = np.argsort(moments, kind="stable")
        sums = self.sums[key][0 if level == "exact" else 1]
        in_order = np.cumsum(sums, axis=1)[:, :-1]
        result = np.empty_like(in_order)
        result[:, order] = in_order
        return result


class ByteClassSums(Reducer):
    """The allocations' lifetimes across the steps' phases (`Lifetimes`, or None when no process has
    phased steps), for byte_classes() to finish with the verdicts. Needs the facts' `phases`
    (step_phases(): pid -> StepPhases), known before the first batch. First look: each (process,
    device) series' running live bytes of device + array memory (groups.batch_series, carried
    across batches) into `Heights`. Second look: each allocation once, at its free or when it can
    never be freed (closed, or live at the end), and whether it is outside a caching allocator
    (judged as the allocators are, AllocatorRows), carried while it is live."""

    field = "byte_classes"
    needs = ("phases",)
    second_look = True

    def start(self, facts) -> None:
        super().start(facts)
        self.kinds = [i for i, name in enumerate(facts.kinds) if name in STEP_KINDS]
        self.heights: Optional[Heights] = None
        self.carry: dict[tuple[int, int], int] = {}  # (pid, device) -> live bytes so far
        self.lifetimes: Optional[Lifetimes] = None
        self.judged = AllocatorRows([])
        self.outside = np.zeros(0, "int64")  # seqs of the live allocations outside, sorted

    def add(self, b) -> None:
        if self.heights is None:  # the phases: known once the flow begins (the streamed steps')
            self.heights = Heights(self.facts.more.get("phases") or {})
        if not self.heights.phases or not len(b):
            return
        for (p, d), rows, live in batch_series(b, self.kinds):  # a few series
            if p in self.heights.phases:
                live = live + self.carry.get((p, d), 0)
                self.carry[(p, d)] = int(live[-1])
                self.heights.add(p, d, b.seq[rows].astype("int64"), b.ts[rows], live)

    def between(self) -> None:
        if self.heights is not None and self.heights.best:
            self.lifetimes = Lifetimes(self.heights)

    def again(self, b) -> None:
        if self.lifetimes is None or not len(b):
            return
        outside = np.zeros(len(b), bool)
        for a in range(0, len(b), SLICE_ROWS):  # the whole frame's batch in slices: bounded temporaries
            rows, _, bits = self.judged.of(_rows(b, a, a + SLICE_ROWS))
            outside[a + rows[(bits & OUTSIDE) != 0]] = True
        freed = np.zeros(len(b), bool)
        for a in range(0, len(b), SLICE_ROWS):
            self._frees(b, a + np.flatnonzero(~b.is_alloc[a:a + SLICE_ROWS] & (b.partner_seq[a:a + SLICE_ROWS] >= 0)
                                              & np.isin(b.kind[a:a + SLICE_ROWS], self.kinds)), outside, freed)
        kept = outside & ~freed  # the batch's allocations outside, live after it: carried
        if kept.any():
            self.outside = np.union1d(self.outside, b.seq[kept])
        if len(b.closed.get("seq", [])):
            self._never_freed(b.closed)

    def _frees(self, b, frees: np.ndarray, outside: np.ndarray, freed: np.ndarray) -> None:
        """The batch's `frees` (rows), classed; `outside`: whether each of its rows is judged outside."""
        if len(frees):
            # each with its allocation's time and judgement: from the batch (its row, the seqs
            # being consecutive), else the live set before it and the carried seqs outside
            partner = b.partner_seq[frees]
            row = partner - int(b.seq[0])
            here = row >= 0
            freed[row[here]] = True
            a_ts, out = np.zeros(len(frees), "int64"), np.zeros(len(frees), bool)
            a_ts[here], out[here] = b.ts[row[here]], outside[row[here]]
            if not here.all():
                before = b.live_before
                seqs, times = np.asarray(before["seq"], "int64"), np.asarray(before["ts"], "int64")
                order = np.argsort(seqs, kind="stable")
                a_ts[~here] = times[order[np.searchsorted(seqs[order], partner[~here])]]
                out[~here] = self._carried(partner[~here])
            self._add(b.pid[frees], b.device[frees], partner, a_ts, b.seq[frees], b.ts[frees], b.bytes[frees], out)

    def _carried(self, seq: np.ndarray) -> np.ndarray:
        """Whether each allocation (of an earlier batch, classed now) is outside; no longer carried."""
        outside = np.isin(seq, self.outside)
        if outside.any():
            self.outside = np.setdiff1d(self.outside, seq[outside], assume_unique=True)
        return outside

    def _never_freed(self, rows: dict) -> None:
        """Allocations (LIVE_COLUMNS) that are never freed in the capture."""
        chosen = np.flatnonzero(np.isin(np.asarray(rows["kind"]), self.kinds))
        if not len(chosen):
            return
        seq, high = np.asarray(rows["seq"], "int64")[chosen], np.full(len(chosen), HIGH, "int64")
        self._add(np.asarray(rows["pid"])[chosen], np.asarray(rows["device"])[chosen], seq,
                  np.asarray(rows["ts"], "int64")[chosen], high, high, np.asarray(rows["bytes"], "int64")[chosen],
                  self._carried(seq))

    def _add(self, pid, device, a_seq, a_ts, f_seq, f_ts, size, outside) -> None:
        pairs = pd.DataFrame({"pid": pid, "device": device}).drop_duplicates()
        for p, d in zip(pairs["pid"].tolist(), pairs["device"].tolist()):  # a few series
            mine = (pid == p) & (device == d)
            self.lifetimes.add(int(p), int(d), a_seq[mine], a_ts[mine], f_seq[mine], f_ts[mine],
                               np.asarray(size)[mine].astype("int64"), outside[mine])

    def finish(self, live: dict) -> Optional[Lifetimes]:
        if self.lifetimes is None:
            return None
        if len(live.get("seq", [])):
            self._never_freed(live)
        return self.lifetimes if self.lifetimes.sums else None


SLICE_ROWS = 1 << 20


def _rows(b, start: int, stop: int) -> SimpleNamespace:
    """What AllocatorRows reads of the batch's rows [start, stop) (views)."""
    return SimpleNamespace(**{name: getattr(b, name)[start:stop] for name in
                              ("is_alloc", "kind", "pool", "pid", "device", "bytes", "ts")},
                           calls={name: values[start:stop] for name, values in b.calls.items()})


def byte_classes(lifetimes: Optional[Lifetimes], reserved, growth: list,
                 gpu_of: Callable[[int, int], Optional[int]]) -> list[ByteClasses]:
    """The section, per (process, device) that has steps with phases and allocations; `reserved`:
    the analysis's ReservedMemory (a pair PyTorch's caching allocator serves is segment-level; one
    with a stream-ordered pool is exact per block, without the pool's unused reserve); `growth`:
    the growth verdicts (where steps keep memory, the forward's segments hold it: no cache)."""
    keeping = {(g.pid, g.device) for g in growth if g.verdict in ("growing", "uneven")}
    caching = {(a.pid, a.device) for a in reserved.allocators if a.allocator.startswith("pytorch")}
    pooled = {(p.pid, p.device) for p in reserved.pools}
    if lifetimes is None:
        return []
    found = []
    for key in sorted(lifetimes.sums):
        pid, device = key
        level = "segment-level" if key in caching else "exact"
        values = lifetimes.at_moments(key, level)
        moments, times, steps = lifetimes.moments[key]
        p = lifetimes.heights.phases[pid]
        if level == "segment-level" and key not in keeping:
            # outside forward and backward the forward's segments hold no activation: cache
            _, phase = p.phase_of(times)
            idle = ~np.isin(phase, (FORWARD, BACKWARD))
            values[CACHE, idle] += values[ACTIVATIONS, idle]
            values[ACTIVATIONS, idle] = 0
        values[:, moments < 0] = 0
        made = lifetimes.made[key][0 if level == "exact" else 1]
        at = [_bytes_at("peak" if k < 0 else p.names[k], int(t), values[:, i], made[:, k] if k >= 0 else None)
              for i, (k, t) in enumerate(zip(steps.tolist(), times.tolist()))]
        listed = at[1:] if len(at) - 1 <= MAX_LISTED else at[1:1 + MAX_LISTED // 2] + at[-(MAX_LISTED // 2):]
        label = SEGMENT_LABEL if level == "segment-level" else POOL_LABEL if key in pooled else EXACT_LABEL
        found.append(ByteClasses(pid=pid, device=device, gpu=gpu_of(pid, device), level=level, label=label,
                                 peak=at[0], steps=listed, step_count=len(at) - 1, rules=rules(level),
                                 message=sentence(at[0], label)))
    return found


def _bytes_at(label: str, time_ns: int, values: np.ndarray, made: Optional[np.ndarray]) -> BytesAt:
    parts = {f"{name}_bytes": int(v) for name, v in zip(BYTE_CLASSES, values.tolist())}
    if made is not None:  # a step: what it allocated, by class
        parts.update({f"made_{name}_bytes": int(v) for name, v in zip(BYTE_CLASSES, made.tolist()) if name in MADE})
    return BytesAt(label=label, time_ns=time_ns, live_bytes=int(values.sum()), **parts)


def sentence(at: BytesAt, label: str) -> str:
    """"at the peak: weights 1.2 GiB, activations 3.1 GiB, ... (exact: no caching allocator)"."""
    parts = [f"{name.replace('_', ' ')} {fmt_bytes(getattr(at, name + '_bytes'))}" for name in BYTE_CLASSES
             if getattr(at, name + "_bytes")]
    return f"at the peak ({fmt_bytes(at.live_bytes)}): " + (", ".join(parts) or "nothing live") + f" ({label})"


def rules(level: str) -> list[str]:
    """Each class's rule at this level, as the outputs show it."""
    if level == "exact":
        return ["weights: allocated before the first step, live after the last",
                "activations: allocated in a step's forward, freed in its backward",
                "gradients: allocated in a backward, freed after it by the next step's end, or kept from the last step",
                "optimizer state: allocated in an optimizer phase, kept after the last step",
                "workspaces: allocated in the first step (not its optimizer), kept after the last step",
                "other: freed in the phase that made it, live at a late capture's start, or no rule names it"]
    return ["segment-level: each class is the caching allocator's segments, which hold several tensors",
            "weights: segments made before the first step, kept after the last",
            "activations: segments made in a forward; outside forward and backward they count as cache",
            "gradients: segments made in a backward",
            "optimizer state: segments made in an optimizer phase",
            "workspaces: blocks outside the allocator (an odd size, or made right after one on its thread: a library's) kept after the last step",
            "cache: the forward's segments outside forward and backward (their activations are freed), "
            "unless the steps keep memory (a growing or uneven verdict: the segments hold what they keep)",
            "other: segments made elsewhere (between phases, after the steps, before a late capture began)"]

