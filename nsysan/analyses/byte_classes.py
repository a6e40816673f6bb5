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
state; a kept block outside the allocator, allocator.AllocatorRows's: workspaces), and the forward's
segments hold no tensor outside forward and backward: there they are the cache.

One reducer (`ByteClassSums`, nsysan/engine) answers on both paths, the whole frame as one batch:
its first look finds the moments to class (`Heights`: each series' highest point and each step's,
from the running live bytes), its second adds each allocation's bytes, classed from its alloc and
free times, to the moments it is live at (`Lifetimes`).
"""

from __future__ import annotations

import re
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..engine import Reducer
from ..model.bytes import BYTE_CLASSES, MADE, ByteClasses, BytesAt
from ..base.units import fmt_bytes
from .groups import batch_groups, batch_series
from .steps import MAX_LISTED, OPEN_END, STEP_KINDS
from .lifetimes import ACTIVATIONS, BACKWARD, CACHE, FORWARD, HIGH, Heights, Lifetimes, StepPhases
from .allocator import DEVICE, OutsideRows

# the phases a step's child ranges name (torch's own habits and the kernel-found ones)
PHASES = {"forward": re.compile(r"^(forward|fwd)\b", re.I), "backward": re.compile(r"^(backward|bwd)\b", re.I),
          "optimizer": re.compile(r"^(optimi[sz]er|optim|opt[._ ]?step)\b", re.I)}
EXACT_LABEL = "exact: no caching allocator"
POOL_LABEL = "exact: one block per tensor from a stream-ordered pool, its unused reserve not counted"
SEGMENT_LABEL = "segment-level: the caching allocator's blocks, not tensors"


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


class ByteClassSums(Reducer):
    """The allocations' lifetimes across the steps' phases (`Lifetimes`, or None when no process has
    phased steps), for byte_classes() to finish with the verdicts. Needs the facts' `phases`
    (step_phases(): pid -> StepPhases), known before the first batch. First look: each (process,
    device) series' running live bytes of device + array memory (groups.batch_series, carried
    across batches) into `Heights`. Second look: each allocation once, at its free or when it can
    never be freed (closed, or live at the end); whether it is outside a caching allocator
    (judged as the allocators are, OutsideRows) is read only for those kept after the last step,
    and carried only for those still live after the batch."""

    field = "byte_classes"
    needs = ("phases",)
    second_look = True
    ahead = True

    def start(self, facts) -> None:
        super().start(facts)
        self.kinds = [i for i, name in enumerate(facts.kinds) if name in STEP_KINDS]
        self.heights: Optional[Heights] = None
        self.carry: dict[tuple[int, int], int] = {}  # (pid, device) -> live bytes so far
        self.lifetimes: Optional[Lifetimes] = None
        self.judged = OutsideRows()
        self.outside = np.zeros(0, "int64")  # seqs of the live allocations outside, sorted

    def add(self, b) -> None:
        if self.heights is None:  # the phases: known once the flow begins (the streamed steps')
            self.heights = Heights(self.facts.more.get("phases") or {})
        if not self.heights.phases or not len(b):
            return
        for (p, d), rows, live in batch_series(b, self.kinds):  # a few series
            if p in self.heights.phases:
                if self.carry.get((p, d)):
                    live = live + self.carry[(p, d)]
                self.carry[(p, d)] = int(live[-1])
                self.heights.add(p, d, b.seq, rows, b.ts[rows], live)

    def _chosen(self, found) -> list[tuple[int, int, int, np.ndarray]]:
        """(pid, device, kind code, rows in time order) of the batch's groups of step kinds and
        phased processes."""
        key = found.keys
        pid, device, kind = key >> 24, ((key >> 8) & 0xFFFF) - 1, key & 0xFF
        chosen = np.flatnonzero(np.isin(kind, self.kinds) & np.isin(pid, list(self.heights.phases)))
        return [(int(pid[g]), int(device[g]), int(kind[g]), found.members(g)[0]) for g in chosen.tolist()]

    def between(self) -> None:
        if self.heights is not None and self.heights.best:
            self.lifetimes = Lifetimes(self.heights)

    def again(self, b) -> None:
        if self.lifetimes is None or not len(b):
            return
        found = batch_groups(b)
        chosen = self._chosen(found)
        freed = np.zeros(len(b), bool)
        position = np.zeros(len(b), "int32")  # each row's place in its group
        held = []  # the frees kept after the last step: classed once their allocations are judged
        for p, d, _, rows in chosen:  # a few groups
            held += self._group(b, p, d, rows, freed, position)
        # judged: the allocations that are live after the batch (whether each is outside is
        # carried to its free) and those of the kept frees
        unfreed = b.is_alloc & ~freed  # (over the batch at once: one gather per group, not two)
        live = [rows[unfreed[rows]] for _, _, kind, rows in chosen if kind == DEVICE]
        judged = np.unique(np.concatenate(live + [h[-1][h[-1] >= 0] for h in held] + [np.zeros(0, "int64")]))
        outside = self.judged.of(b, judged)
        for p, d, a_seq, a_ts, f_seq, f_ts, size, out, row in held:
            here = row >= 0
            out[here] = outside[np.searchsorted(judged, row[here])]
            self.lifetimes.add(p, d, a_seq, a_ts, f_seq, f_ts, size, out)
        if len(judged):
            kept = judged[outside & ~freed[judged]]  # the batch's allocations outside, live after it: carried
            if len(kept):
                self.outside = np.union1d(self.outside, b.seq[kept])
        if len(b.closed.get("seq", [])):
            self._never_freed(b.closed)

    def _group(self, b, p: int, d: int, rows: np.ndarray, freed: np.ndarray, position: np.ndarray) -> list:
        """Class the frees of one group (its `rows`, in time order) freed by the last step's end;
        those after it are returned to class once judged (see _frees). Each row's region of the
        phases and moment (Lifetimes.places) are found once, in time order, for the group's rows
        (a binary search of sorted times is ~10 times faster than of the allocations' times in
        the order of their frees), and an allocation's are its row's."""
        end_last, seq0, held = self.heights.phases[p].regions().end_last, int(b.seq[0]), []
        if not self.lifetimes.tracks(p, d):  # (no moments: its frees only marked, as freed)
            frees = rows[~b.is_alloc[rows] & (b.partner_seq[rows] >= 0)]
            alloc = b.partner_seq[frees] - seq0
            freed[alloc[alloc >= 0]] = True
            return self._frees(b, p, d, frees, end_last)
        region, moment = self.lifetimes.places(p, d, rows, b.ts, seq0)
        position[rows] = np.arange(len(rows), dtype="int32")
        cut = int(np.searchsorted(b.ts, end_last, side="right"))  # the rows by the last step's end
        for a in range(0, len(rows), SLICE_ROWS):  # in slices of rows: bounded temporaries
            part = rows[a:a + SLICE_ROWS]
            at = np.flatnonzero(~b.is_alloc[part])
            partner = b.partner_seq[part[at]]
            if (partner < 0).any():  # frees without their allocation: nothing to class
                at, partner = at[partner >= 0], partner[partner >= 0]
            alloc = partner - seq0  # the frees' allocations' rows
            at += a  # the frees' places
            frees = rows[at]
            freed[alloc[alloc >= 0]] = True
            # an allocation of this group, in this batch (else an earlier one's, or another group's)
            place = position[np.maximum(alloc, 0)]
            simple = (alloc >= 0) & (rows[np.minimum(place, len(rows) - 1)] == alloc) & (frees < cut)
            if simple.all():
                self.lifetimes.add_places(p, d, region[place], region[at], moment[place], moment[at],
                                          b.bytes[frees])
                continue
            self.lifetimes.add_places(p, d, region[place[simple]], region[at[simple]], moment[place[simple]],
                                      moment[at[simple]], b.bytes[frees[simple]])
            held += self._frees(b, p, d, frees[~simple], end_last)
        return held

    def _frees(self, b, p: int, d: int, frees: np.ndarray, end_last: int) -> list:
        """Class the `frees` (rows) of one (process, device) freed by the last step's end; those
        after it are returned (p, d, alloc seq and time, free seq and time, size, outside (as far
        as known: carried), the allocation's row (-1: an earlier batch's)) to class once judged."""
        if not len(frees):
            return []
        # each with its allocation's time: from the batch (its row, the seqs being consecutive),
        # else the live set before it
        partner = b.partner_seq[frees]
        row = partner - int(b.seq[0])
        here = row >= 0
        out = np.zeros(len(frees), bool)
        a_ts = np.zeros(len(frees), "int64")
        a_ts[here] = b.ts[row[here]]
        if not here.all():
            before = b.live_before
            seqs, times = np.asarray(before["seq"], "int64"), np.asarray(before["ts"], "int64")
            order = np.argsort(seqs, kind="stable")
            a_ts[~here] = times[order[np.searchsorted(seqs[order], partner[~here])]]
            out[~here] = self._carried(partner[~here])  # (no longer carried once freed)
        f_seq, f_ts, size = b.seq[frees], b.ts[frees], b.bytes[frees].astype("int64")
        kept = f_ts > end_last
        rest = ~kept
        self.lifetimes.add(p, d, partner[rest], a_ts[rest], f_seq[rest], f_ts[rest], size[rest], None)
        if not kept.any():
            return []
        return [(p, d, partner[kept], a_ts[kept], f_seq[kept], f_ts[kept], size[kept], out[kept],
                 np.where(here[kept], row[kept], -1))]

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
        pid, device = np.asarray(rows["pid"])[chosen], np.asarray(rows["device"])[chosen]
        ts, size, outside = np.asarray(rows["ts"], "int64")[chosen], np.asarray(rows["bytes"], "int64")[chosen], \
            self._carried(seq)
        for p, d in sorted(set(zip(pid.tolist(), device.tolist()))):  # a few series
            mine = (pid == p) & (device == d)
            self.lifetimes.add(p, d, seq[mine], ts[mine], high[mine], high[mine], size[mine], outside[mine])

    def finish(self, live: dict) -> Optional[Lifetimes]:
        if self.lifetimes is None:
            return None
        if len(live.get("seq", [])):
            self._never_freed(live)
        return self.lifetimes if self.lifetimes.sums else None


SLICE_ROWS = 1 << 20


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
        made = lifetimes.made_by(key, level)
        n = len(steps) - 1  # the moments: the peak, then each step's
        # only the steps listed are made (the first and last MAX_LISTED / 2 of a long run)
        shown = list(range(1, n + 1)) if n <= MAX_LISTED else \
            list(range(1, 1 + MAX_LISTED // 2)) + list(range(n + 1 - MAX_LISTED // 2, n + 1))
        at = [_bytes_at("peak" if steps[i] < 0 else p.names[steps[i]], int(times[i]), values[:, i],
                        made[:, steps[i]] if steps[i] >= 0 else None) for i in [0] + shown]
        label = SEGMENT_LABEL if level == "segment-level" else POOL_LABEL if key in pooled else EXACT_LABEL
        found.append(ByteClasses(pid=pid, device=device, gpu=gpu_of(pid, device), level=level, label=label,
                                 peak=at[0], steps=at[1:], step_count=n, rules=rules(level),
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

