"""The step tables and the phases (steps.py, phases.py) from one reducer, `StepWindows`, on both
paths: the whole events frame as one batch, or the streamed flow of many.

The steps and the range instances that can be phases are time windows on each (process, device)
series of device + array bytes, known before the first event (`FoundSteps`: the NVTX ranges are
read whole, the kernels' iterations from the launches). The first look hands each batch's series
to the windows (windows.Windows), which keep per window the live bytes before its start and at
its end, the highest inside and the bytes allocated inside. A step's kept bytes and holders are
its allocations never freed, with the site and innermost NVTX range each was made at: the second
look carries the device and array allocations of the processes with steps until their free,
reading those two labelled columns of the batch (`calls["site"]`, `calls["nvtx_range"]`, named
by engine.Labels); what is left at the end was never freed. Held: a few numbers per step and range instance, and those allocations
while they are live.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..engine import Labels, Reducer
from ..events.arrays import among
from ..events.columns import empty_ranges
from ..model import Phase, StepSeries
from .iteration_phases import with_iteration_phases
from .iterations import find_iterations
from .phases import numbered_paths, phase_ranges, phases_of, ranked
from .groups import batch_series
from .growth import growth_diagnostics, judge_all
from .steps import OPEN_END, STEP_KINDS, find_step_ranges, holders_by_step, listed, step_diagnostics, step_series, \
    step_spans
from .windows import Windows

KEPT = ("seq", "ts", "pid", "device", "bytes", "site", "nvtx")


@dataclass
class FoundSteps:
    """What the steps and phases are, before the events: per process its steps (pid -> (family,
    spans): find_step_ranges', then the kernels' iterations'), the iterations, the NVTX ranges with
    the iterations' phases, and the rows of those that can be phases (phases.phase_ranges)."""

    steps: dict
    iterations: dict
    ranges: pd.DataFrame
    phase_rows: np.ndarray


def found_steps(ranges: pd.DataFrame, threads: np.ndarray, step_range: Optional[str],
                launches: Optional[tuple[pd.DataFrame, dict]], nvtx_steps: Optional[dict] = None) -> FoundSteps:
    """`threads`: steps.memory_threads' keys; `launches`: read_launches() of the processes whose
    NVTX ranges give no steps (None with --step-range), whose steps the kernels then give;
    `nvtx_steps`: find_step_ranges' answer, when already found."""
    found = nvtx_steps if nvtx_steps is not None else find_step_ranges(ranges, threads, step_range)
    iterations = {}
    if launches is not None:
        # the processes whose launches were read (read_launches reads only those it is asked for)
        pids = sorted(set(launches[0]["pid"].tolist()) - set(found))
        iterations = find_iterations(*launches, pids)
    phased = with_iteration_phases(ranges, [it.phases for it in iterations.values()])
    rows = np.flatnonzero(phase_ranges(phased, threads)) if not phased.empty else np.zeros(0, "int64")
    # find_step_ranges' steps with the processes whose steps the kernels gave, named "iteration N"
    steps = {**found, **{pid: ("iteration N", it.spans) for pid, it in iterations.items()}}
    return FoundSteps(steps, iterations, phased, rows)


class StepWindows(Reducer):
    """The windows of the steps and phases on each (process, device) series, and the allocations
    never freed of the processes with steps (see the module's docstring). Needs the facts'
    `found_steps` (FoundSteps; none: no steps and no phases, the series alone are found) and the
    batches' `labels` (their sites and NVTX ranges, read on the second look). Its
    answer: itself, whose `answers()` are the steps, phases and growth verdicts."""

    field = "steps"
    needs = ("found_steps", "labels")
    second_look = True

    def start(self, facts) -> None:
        super().start(facts)
        found = facts.more.get("found_steps")
        self.found = found if found is not None else FoundSteps({}, {}, empty_ranges(), np.zeros(0, "int64"))
        self.phase_pid = self.found.ranges["pid"].to_numpy()[self.found.phase_rows] if len(self.found.phase_rows) \
            else np.zeros(0, "int64")
        self.kinds = [i for i, name in enumerate(facts.kinds) if name in STEP_KINDS]
        self.carry: dict[tuple[int, int], int] = {}  # (pid, device) -> its live bytes so far
        self.windows = Windows()
        self.series: dict[tuple[int, int], tuple] = {}  # (pid, device) -> (code, step window ids, phase rows, ids)
        self.live = {c: np.zeros(0, "int64") for c in KEPT}

    def add(self, b) -> None:
        for (pid, device), rows, live in batch_series(b, self.kinds) if len(b) else ():  # a few series
            if (pid, device) not in self.series:
                self._open(pid, device)
            live = live + self.carry.get((pid, device), 0)
            self.carry[(pid, device)] = int(live[-1])
            self.windows.add_series(self.series[(pid, device)][0], b.ts[rows], live, np.maximum(b.delta[rows], 0))

    def _open(self, pid: int, device: int) -> None:
        """The windows of the series' steps and phases, opened at its first event."""
        code = len(self.series)
        steps = np.zeros(0, "int64")
        if pid in self.found.steps:
            spans = self.found.steps[pid][1]
            raw = spans["end_ns"].to_numpy()
            # An open step ends at the capture's end, not known until the flow ends: no event
            # lies beyond it, so the window runs to the last time an event can have.
            steps = self.windows.open(code, spans["start_ns"].to_numpy(), np.where(raw < OPEN_END, raw, OPEN_END - 1))
        rows = self.found.phase_rows[self.phase_pid == pid]
        ranges = self.found.ranges
        phases = self.windows.open(code, ranges["start_ns"].to_numpy()[rows], ranges["end_ns"].to_numpy()[rows])
        self.series[(pid, device)] = (code, steps, rows, phases)

    def between(self) -> None:
        self.live = {c: np.zeros(0, "int64") for c in KEPT}  # (again, should the second look start over)

    def again(self, b) -> None:
        """The device and array allocations of processes with steps, carried until their free."""
        if not self.found.steps or not len(b):
            return
        made = np.flatnonzero(b.is_alloc & (b.bytes > 0) & among(b.kind, self.kinds)
                              & among(b.pid, list(self.found.steps)))
        frees = b.partner_seq[b.partner_seq >= 0]
        here = frees - int(b.seq[0])  # a batch's seqs are consecutive
        freed = np.zeros(len(b), bool)
        freed[here[here >= 0]] = True
        made = made[~freed[made]]
        earlier = frees[here < 0]
        still = ~np.isin(self.live["seq"], earlier) if len(earlier) else slice(None)
        columns = {"seq": b.seq, "ts": b.ts, "pid": b.pid, "device": b.device, "bytes": b.bytes,
                   "site": b.calls["site"], "nvtx": b.calls["nvtx_range"]}
        self.live = {c: np.concatenate([self.live[c][still], np.asarray(columns[c][made], "int64")]) for c in KEPT}

    def finish(self, live: dict) -> "StepWindows":
        """Itself: what is carried now was never freed (the allocations live at the end and those
        whose address another took while they were live, which no free reaches)."""
        self.windows.finish()
        return self

    def answers(self, end_ns: int, gpu_of: Callable[[int, int], Optional[int]], step_range: Optional[str],
                trace_end_ns: Optional[dict[int, int]], labels: Labels, processes: list, caps: list, has_ranges: bool,
                quick: bool) -> tuple[list[StepSeries], list[Phase], list, list]:
        """The document's steps (those listed), phases and growth verdicts (judged on every step, with
        the capture's `processes` and `caps`), and the diagnostics about them (no_steps, memory_growth,
        memory_kept_unevenly); `has_ranges`: the capture has NVTX ranges (see tables())."""
        steps, phases = self.tables(end_ns, gpu_of, "step-range" if step_range is not None else "nvtx", trace_end_ns,
                                    labels)
        growth = judge_all(steps, processes, caps)
        notes = step_diagnostics(self.series, steps, has_ranges, quick, step_range) + growth_diagnostics(growth)
        return [listed(s) for s in steps], phases, growth, notes

    def tables(self, end_ns: int, gpu_of: Callable[[int, int], Optional[int]], found_by: str,
               trace_end_ns: Optional[dict[int, int]], labels: Labels) -> tuple[list[StepSeries], list[Phase]]:
        """The step tables (every step) and the phases, given the capture's end; `trace_end_ns`: pid
        -> where its CUDA trace stops, for processes whose trace stops early; `labels`: what the
        batches' site and NVTX range codes name."""
        w, found = self.windows, self.found
        steps: list[StepSeries] = []
        order = sorted(self.series.items())  # by (process, device)
        kept = pd.DataFrame(self.live).sort_values("seq", kind="stable")
        for (pid, device), (_, ids, _, _) in order:
            if pid not in found.steps:
                continue
            family, spans = found.steps[pid]
            starts, ends, closed = step_spans(spans, end_ns)
            mine = kept[(kept["pid"].to_numpy() == pid) & (kept["device"].to_numpy() == device)]
            kept_bytes, holders = _kept(mine, starts, ends, labels.sites, labels.ranges)
            start_live = w.before[ids]
            steps.append(step_series(pid, device, gpu_of(pid, device), family, found_by, spans, (starts, ends, closed),
                                     (start_live, w.end[ids], np.maximum(start_live, w.high[ids]), w.summed[ids],
                                      kept_bytes), holders, trace_end_ns, found.iterations.get(pid)))
        phases: list[Phase] = []
        if len(found.phase_rows):
            paths = numbered_paths(found.ranges)
            for (pid, device), (_, _, rows, ids) in order:
                # a range still open at the capture's end is no phase
                closed = found.ranges["end_ns"].to_numpy()[rows] < min(OPEN_END, max(end_ns, 0))
                rows, ids = rows[closed], ids[closed]
                if len(rows):
                    start_live = w.before[ids]
                    phases += phases_of(pid, device, gpu_of(pid, device), paths[rows],
                                        found.ranges["start_ns"].to_numpy()[rows], start_live,
                                        np.maximum(start_live, w.high[ids]), w.end[ids], steps)
        return steps, ranked(phases)


def _kept(mine: pd.DataFrame, starts: np.ndarray, ends: np.ndarray, sites, names) -> tuple[np.ndarray, dict]:
    """Per step, the bytes of the allocations made inside it and never freed, and who holds them
    (an allocation is its latest-starting step's, when inside it); `mine`: one series' allocations
    never freed, in event order."""
    ts, size = mine["ts"].to_numpy(), mine["bytes"].to_numpy()
    cum = np.concatenate([[0], np.cumsum(size)])
    kept = cum[np.searchsorted(ts, ends, side="right")] - cum[np.searchsorted(ts, starts, side="left")]
    step_of = np.searchsorted(starts, ts, side="right") - 1
    inside = np.flatnonzero((step_of >= 0) & (ts <= ends[np.maximum(step_of, 0)]))
    if not len(inside):
        return kept, {}
    return kept, holders_by_step(step_of[inside], mine["site"].to_numpy()[inside], mine["nvtx"].to_numpy()[inside],
                                 size[inside], sites, names)
