"""Steps, the growth verdict and phases in the streamed full analysis (streamed_full.py): the
whole-frame step tables (steps.step_table), phases (phases.phase_costs) and what judge_all
makes of them, from the flow of event batches.

The steps and the phases' range instances are time windows on each (process, device) series of
device + array bytes, known before the flow (the NVTX ranges are read whole); the first pass
feeds FirstLook's running sums of those series (its spike series) into windows.Windows,
which keeps per window the live bytes at its start and end, the highest inside and the bytes
allocated inside. A step's kept bytes and holders are its allocations never freed: known once
the flow has been read, they are the allocations still live at the end and those whose address
was taken while they were live (never_freed.NeverFreed's rows), with the site and innermost NVTX range
the second pass gave each (streamed_sites.SiteSums), so only the windows' numbers and the
never-freed allocations are held.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..model import StepSeries
from .iteration_phases import with_iteration_phases
from .iterations import find_iterations, with_iterations
from .phases import phase_ranges, phases_of, range_paths, ranked
from .steps import OPEN_END, STEP_KINDS, find_step_ranges, holders_by_step, step_series, step_spans
from .streamed import FirstLook
from .windows import Windows


class StepWindows:
    """The first pass's consumer: on each (process, device) series, the windows of its process's
    steps and of the range instances that can be phases, opened when the series first appears."""

    def __init__(self, look: FirstLook, ranges: pd.DataFrame, threads: np.ndarray, step_range: Optional[str],
                 launches: Optional[tuple[pd.DataFrame, dict]] = None, found: Optional[dict] = None) -> None:
        """`launches`: read_launches() of the processes whose NVTX ranges give no steps (none with
        --step-range), whose steps the kernels then give; `found`: find_step_ranges' steps, when
        already found."""
        self.look = look
        found = found if found is not None else find_step_ranges(ranges, threads, step_range)
        # the processes whose launches were read (read_launches reads only those it is asked for)
        pids = sorted(set(launches[0]["pid"].tolist())) if launches is not None else []
        self.iterations = find_iterations(*launches, [p for p in pids if p not in found]) if launches is not None else {}
        self.found = with_iterations(found, self.iterations)
        # the phases' ranges: the NVTX ranges and those of the kernel steps' phases
        self.ranges = ranges = with_iteration_phases(ranges, [it.phases for it in self.iterations.values()])
        self.phase_rows = np.flatnonzero(phase_ranges(ranges, threads)) if not ranges.empty else np.zeros(0, "int64")
        self.phase_pid = ranges["pid"].to_numpy()[self.phase_rows] if len(self.phase_rows) else np.zeros(0, "int64")
        self.windows = Windows()
        self.series: dict[int, tuple] = {}  # code -> (pid, device, step window ids, phase rows, their ids)

    def add(self, b) -> None:
        got = self.look.batch_live.get("spikes")
        if got is None:
            return
        rows, codes, live = got
        for code in pd.unique(codes).tolist():  # a few series
            if code not in self.series:
                self._open(int(code))
        self.windows.add(codes, b.ts[rows], live, np.maximum(b.delta[rows], 0))

    def _open(self, code: int) -> None:
        key = next(k for k, c in self.look.spike_series.index.items() if c == code)
        pid, device = _pair(key)
        steps = np.zeros(0, "int64")
        if pid in self.found:
            spans = self.found[pid][1]
            raw = spans["end_ns"].to_numpy()
            # An open step ends at the capture's end, not known until the flow ends: no event
            # lies beyond it, so the window runs to the last time an event can have.
            steps = self.windows.open(code, spans["start_ns"].to_numpy(), np.where(raw < OPEN_END, raw, OPEN_END - 1))
        rows = self.phase_rows[self.phase_pid == pid]
        phases = self.windows.open(code, self.ranges["start_ns"].to_numpy()[rows],
                                   self.ranges["end_ns"].to_numpy()[rows])
        self.series[code] = (pid, device, steps, rows, phases)

    def tables(self, end_ns: int, gpu_of: Callable[[int, int], Optional[int]], found_by: str,
               trace_end_ns: dict[int, int], kept: pd.DataFrame, sites, names) -> tuple[list[StepSeries], list]:
        """The step tables (every step) and the phases, once the flow is read. `kept`: the
        allocations never freed (kept_allocations), `sites` and `names` the labels of their codes."""
        self.windows.finish()
        w = self.windows
        steps: list[StepSeries] = []
        order = sorted(self.series.items(), key=lambda item: (item[1][0], item[1][1]))  # by (process, device)
        for _, (pid, device, ids, _, _) in order:
            if pid not in self.found:
                continue
            family, spans = self.found[pid]
            starts, ends, closed = step_spans(spans, end_ns)
            mine = kept[(kept["pid"].to_numpy() == pid) & (kept["device"].to_numpy() == device)]
            kept_bytes, holders = _kept(mine, starts, ends, sites, names)
            start_live = w.before[ids]
            steps.append(step_series(pid, device, gpu_of(pid, device), family, found_by, spans, (starts, ends, closed),
                                     (start_live, w.end[ids], np.maximum(start_live, w.high[ids]), w.summed[ids],
                                      kept_bytes), holders, trace_end_ns, self.iterations.get(pid)))
        phases = []
        if len(self.phase_rows):
            paths = range_paths(self.ranges)
            for _, (pid, device, _, rows, ids) in order:
                # a range still open at the capture's end is no phase (phase_costs)
                closed = self.ranges["end_ns"].to_numpy()[rows] < min(OPEN_END, max(end_ns, 0))
                rows, ids = rows[closed], ids[closed]
                if len(rows):
                    start_live = w.before[ids]
                    phases += phases_of(pid, device, gpu_of(pid, device), paths[rows],
                                        self.ranges["start_ns"].to_numpy()[rows], start_live,
                                        np.maximum(start_live, w.high[ids]), w.end[ids], steps)
        return steps, ranked(phases)


def kept_allocations(never_freed: pd.DataFrame, kinds: list[str], site_sums) -> pd.DataFrame:
    """The device and array allocations never freed (NeverFreed's rows), in event order (seq, ts,
    pid, device, bytes), with their site and innermost NVTX range as codes into site_sums' labels
    and strings."""
    frame = never_freed
    if frame.empty:
        return pd.DataFrame({c: np.zeros(0, "int64") for c in ("seq", "ts", "pid", "device", "bytes", "site", "nvtx")})
    chosen = frame["kind"].isin([kinds.index(k) for k in STEP_KINDS]).to_numpy() & (frame["bytes"].to_numpy() > 0)
    frame = frame[chosen].sort_values("seq", ignore_index=True)
    info = {c: np.concatenate([site_sums.live[c]] + [part[c] for part in site_sums.closed])
            for c in ("seq", "site", "nvtx_range")}
    at = pd.Index(info["seq"]).get_indexer(frame["seq"].to_numpy())
    return pd.DataFrame({"seq": frame["seq"].to_numpy(), "ts": frame["ts"].to_numpy(), "pid": frame["pid"].to_numpy(),
                         "device": frame["device"].to_numpy(), "bytes": frame["bytes"].to_numpy(),
                         "site": info["site"][at], "nvtx": info["nvtx_range"][at]})


def _kept(mine: pd.DataFrame, starts: np.ndarray, ends: np.ndarray, sites, names) -> tuple[np.ndarray, dict]:
    """Per step, the bytes of the allocations made inside it and never freed, and who holds them
    (steps._holders: an allocation is its latest-starting step's, when inside it)."""
    ts, size = mine["ts"].to_numpy(), mine["bytes"].to_numpy().astype("int64")
    cum = np.concatenate([[0], np.cumsum(size)])
    kept = cum[np.searchsorted(ts, ends, side="right")] - cum[np.searchsorted(ts, starts, side="left")]
    step_of = np.searchsorted(starts, ts, side="right") - 1
    inside = np.flatnonzero((step_of >= 0) & (ts <= ends[np.maximum(step_of, 0)]))
    if not len(inside):
        return kept, {}
    return kept, holders_by_step(step_of[inside], mine["site"].to_numpy()[inside], mine["nvtx"].to_numpy()[inside],
                                 size[inside], sites, names)


def _pair(key: int) -> tuple[int, int]:
    return key >> 16, (key & 0xFFFF) - 0x10000 if key & 0x8000 else key & 0xFFFF
