"""CUDA-graph memory: graphs captured, instantiated and destroyed per step, and the memory
captured into them (docs/analyses.md, "CUDA graphs").

Works on a finished `Analysis` (its steps and timeline) and the graph API calls
(events/read_code.py), so the whole-frame and the streamed analyses give the same section.
The memory captured into a graph is what the process's live device + array bytes gained
between the start of `cudaStreamBeginCapture` and the end of `cudaStreamEndCapture`: allocations
made while a capture is open (PyTorch's graph private pools, graph memory nodes) stay with the
graph until it is destroyed, so they are the graph's. The timeline keeps every event of a series
up to MAX_POINTS events; beyond it, the bytes are its points' and marked approximate.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ..model import Analysis
from ..model.hidden import CudaGraphs, ProcessGraphs, StepGraphs
from ..base.units import fmt_bytes
from .timeline import MAX_POINTS

LIVE_KINDS = ("device", "array")  # what steps count: allocated by the program


def cuda_graphs(analysis: Analysis, calls: pd.DataFrame) -> CudaGraphs:
    graph_calls = calls[calls["what"].isin(("capture_begin", "capture_end", "instantiate", "exec_destroy",
                                            "graph_destroy", "launch", "mem_node"))]
    processes = [_process(analysis, int(pid), rows) for pid, rows in graph_calls.groupby("pid", sort=True)]
    processes = [p for p in processes if p.captures or p.instantiated or p.mem_nodes]
    message = "; ".join(p.message for p in processes if p.instantiated or p.captured_bytes)
    return CudaGraphs(processes=processes, message=message)


def _process(analysis: Analysis, pid: int, rows: pd.DataFrame) -> ProcessGraphs:
    count = rows["what"].value_counts()
    begins = rows[rows["what"] == "capture_begin"]
    ends = rows[rows["what"] == "capture_end"]
    series = [s for s in analysis.timeline.series if s.pid == pid and s.kind in LIVE_KINDS and s.ts_ns]
    windows = _capture_windows(begins, ends)
    before = live_at(series, windows[:, 0], strictly_before=True)
    after = live_at(series, windows[:, 1])
    captured = np.maximum(after - before, 0)
    steps = step_list(analysis, pid)
    listed = []
    for step in steps:
        inside = rows[(rows["ts_ns"] >= step.start_ns) & (rows["ts_ns"] < step.end_ns)]
        in_step = (windows[:, 0] >= step.start_ns) & (windows[:, 0] < step.end_ns)
        if inside.empty:
            continue
        what = inside["what"].value_counts()
        listed.append(StepGraphs(name=step.name, start_ns=step.start_ns, end_ns=step.end_ns,
                                 captured=int(what.get("capture_end", 0)), instantiated=int(what.get("instantiate", 0)),
                                 destroyed=int(what.get("exec_destroy", 0)), launches=int(what.get("launch", 0)),
                                 captured_bytes=int(captured[in_step].sum()), delta_bytes=step.delta_bytes))
    with_captures = [s for s in listed if s.captured]
    per_values = [s.captured_bytes for s in with_captures] if with_captures else [int(c) for c in captured]
    last_work = max([s.end_ns for s in steps] + [int(v) for v in
                                                rows.loc[rows["what"].isin(("launch", "capture_end")), "end_ns"]],
                    default=None)
    destroys = rows.loc[rows["what"] == "exec_destroy", "ts_ns"]
    at_exit = int((destroys > last_work).sum()) if last_work is not None else 0
    found = ProcessGraphs(
        pid=pid, process=analysis.process_label(pid), captures=int(count.get("capture_begin", 0)),
        instantiated=int(count.get("instantiate", 0)), exec_destroyed=int(count.get("exec_destroy", 0)),
        exec_destroyed_at_exit=at_exit, templates_destroyed=int(count.get("graph_destroy", 0)),
        launches=int(count.get("launch", 0)), mem_nodes=int(count.get("mem_node", 0)),
        captured_bytes=int(captured.sum()), captured_min_bytes=min(per_values, default=0),
        captured_max_bytes=max(per_values, default=0),
        steps_kept_bytes=(sum(s.delta_bytes or 0 for s in with_captures) if with_captures else None),
        per=(_family(analysis, pid) if with_captures else "capture"), steps=listed,
        approximate=any(len(s.ts_ns) >= MAX_POINTS for s in series))
    return _with_message(found)


def _capture_windows(begins: pd.DataFrame, ends: pd.DataFrame) -> np.ndarray:
    """(begin start, end end) of each capture: each begin with the first end after it on its thread."""
    windows = []
    for tid, b in begins.groupby("tid"):
        e = ends[ends["tid"] == tid]
        starts, stops = b["ts_ns"].to_numpy(), np.sort(e["end_ns"].to_numpy())
        at = np.searchsorted(stops, starts, side="left")
        for start, i in zip(starts, at):
            if i < len(stops):
                windows.append((int(start), int(stops[i])))
    return np.array(sorted(windows), "int64").reshape(-1, 2)


def live_at(series: list, times: np.ndarray, strictly_before: bool = False) -> np.ndarray:
    """The summed live bytes of the series at each time (each series' level holds until its next
    point); `strictly_before`: just before each time, without the points at it."""
    total = np.zeros(len(times), "int64")
    for s in series:
        at = np.asarray(s.ts_ns, "int64")
        level = np.asarray(s.live_bytes, "int64")
        index = np.searchsorted(at, times, side="left" if strictly_before else "right") - 1
        total += np.where(index >= 0, level[np.clip(index, 0, None)], 0)
    return total


def step_list(analysis: Analysis, pid: int) -> list:
    """The listed steps of the process (of its device with the most steps), in time order."""
    found = [s for s in analysis.steps if s.pid == pid]
    return list(max(found, key=lambda s: len(s.steps)).steps) if found else []


def _family(analysis: Analysis, pid: int) -> str:
    found = [s for s in analysis.steps if s.pid == pid]
    return max(found, key=lambda s: len(s.steps)).range_name if found else "step N"


def _with_message(p: ProcessGraphs) -> ProcessGraphs:
    graphs = "1 CUDA graph" if p.instantiated == 1 else f"{p.instantiated} CUDA graphs"
    alive = p.instantiated - (p.exec_destroyed - p.exec_destroyed_at_exit)
    if not p.exec_destroyed:
        fate = "none destroyed"
    elif alive == p.instantiated:
        fate = "none destroyed before exit" if p.exec_destroyed_at_exit else "none destroyed"
    else:
        fate = f"{p.exec_destroyed - p.exec_destroyed_at_exit} destroyed before exit"
    # "request N" -> "request"; a --step-range pattern or kernel-found steps are "step"s
    unit = "capture" if p.per == "capture" else p.per[:-2] if p.per.endswith(" N") and p.per[:-2].strip() else "step"
    about = "about " if p.approximate else ""
    if p.captured_bytes:
        spread = (f"{about}+{fmt_bytes(p.captured_min_bytes)}" if p.captured_min_bytes == p.captured_max_bytes
                  else f"{about}+{fmt_bytes(p.captured_min_bytes)} to +{fmt_bytes(p.captured_max_bytes)}")
        memory = f": {spread} per {unit} captured into them, {fmt_bytes(p.captured_bytes)} in all"
        if p.steps_kept_bytes:
            memory += f" ({share_text(p.captured_bytes, p.steps_kept_bytes)} of what those {unit}s kept)"
    else:
        memory = ": no memory was allocated while a capture was open"
    return dataclasses.replace(p, message=f"{p.process}: {graphs} instantiated, {fate}{memory}")


def share_text(part: int, whole: int) -> str:
    """`part` of `whole` in words: "all", "70%", or "more than all" when there is no whole."""
    if whole <= 0:
        return "more than all"
    share = part / whole
    return "all" if share >= 0.995 else f"{share:.0%}"


def graph_severity(p: ProcessGraphs) -> str:
    """warning when graphs kept memory that no graph destroy gave back before exit, else info."""
    return "warning" if p.captured_bytes and p.exec_destroyed == p.exec_destroyed_at_exit else "info"
