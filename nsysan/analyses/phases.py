"""What each phase costs: live bytes at the start of every NVTX range instance, how far the peak
inside it rose above that start, and its net change at the end, per range path and process.

This is what people measure by wrapping `forward`, `backward()` and `optimizer.step()` with
`torch.cuda.memory_allocated()` / `max_memory_allocated()`, but at the driver level: a caching
allocator only calls cudaMalloc when its cache runs short, so a phase that reuses the cache
costs 0 here. A range instance is a time window on the whole process (the backward pass
allocates from PyTorch's autograd thread inside the main thread's `backward`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..events.nvtx import range_paths, thread_key
from ..model import Phase, StepSeries
from .steps import OPEN_END

MAX_PHASES = 40  # per analysis, the largest rises first
MAX_INSTANCES = 200  # per phase, listed in time order (the statistics use them all)


def numbered_paths(ranges: pd.DataFrame) -> np.ndarray:
    """Each range's path of names (events.nvtx.range_paths), numbers as N: "step N > backward"."""
    numbered = ranges["name"].astype(str).str.replace(r"\d+", "N", regex=True)
    return range_paths(ranges, numbered.to_numpy(dtype=object))


def phase_ranges(ranges: pd.DataFrame, memory_threads: np.ndarray) -> np.ndarray:
    """Which ranges can be phases: those on a thread that makes memory calls (any thread of a
    process that makes none: a capture begun after warm-up, steps.find_step_ranges), never left
    open (OPEN_END; the capture's end closes no phase either, which step_windows checks)."""
    keys = thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy())
    return (ranges["end_ns"].to_numpy() < OPEN_END) & (
        np.isin(keys, memory_threads) | ~np.isin(ranges["pid"].to_numpy(), memory_threads >> 24))


def phases_of(pid: int, device: int, gpu, paths: np.ndarray, starts: np.ndarray, start_live: np.ndarray,
              peak: np.ndarray, end_live: np.ndarray, steps: list[StepSeries]) -> list[Phase]:
    """The phases of one (process, device), given per range instance its path, start, the live
    bytes at its start, the peak inside (at least the start's) and at its end."""
    step_of = _step_numbers(starts, steps, pid, device)
    table = pd.DataFrame({"path": paths, "start_ns": starts, "start_live": start_live, "rise": peak - start_live,
                          "net": end_live - start_live, "step": step_of}).sort_values("start_ns", kind="stable")
    return [_phase(pid, device, gpu, str(path), rows)
            for path, rows in table.groupby("path", sort=False)]  # one per range path


def ranked(found: list[Phase]) -> list[Phase]:
    """The MAX_PHASES largest rises, first."""
    found.sort(key=lambda p: (-p.rise_max_bytes, p.pid, p.device, p.path))
    return found[:MAX_PHASES]


def _step_numbers(starts: np.ndarray, steps: list[StepSeries], pid: int, device: int) -> np.ndarray:
    """The number of the step each instance starts in, -1 outside the steps."""
    mine = next((s for s in steps if s.pid == pid and s.device == device), None)
    if mine is None or not mine.steps:
        return np.full(len(starts), -1, "int64")
    step_starts = np.array([st.start_ns for st in mine.steps], "int64")
    step_ends = np.array([st.end_ns for st in mine.steps], "int64")
    numbers = np.array([st.number for st in mine.steps], "int64")
    at = np.searchsorted(step_starts, starts, side="right") - 1
    inside = (at >= 0) & (starts <= step_ends[np.maximum(at, 0)])
    return np.where(inside, numbers[np.maximum(at, 0)], -1)


def _phase(pid: int, device: int, gpu, path: str, rows: pd.DataFrame) -> Phase:
    rise, net = rows["rise"].to_numpy(), rows["net"].to_numpy()
    listed = rows.head(MAX_INSTANCES)
    return Phase(pid=pid, device=device, gpu=gpu, path=path, instances=len(rows),
                 start_live_median_bytes=int(np.median(rows["start_live"].to_numpy())),
                 rise_median_bytes=int(np.median(rise)), rise_max_bytes=int(rise.max()),
                 net_median_bytes=int(np.median(net)), net_min_bytes=int(net.min()), net_max_bytes=int(net.max()),
                 start_ns=listed["start_ns"].tolist(), start_live_bytes=listed["start_live"].tolist(),
                 rise_bytes=listed["rise"].tolist(), net_bytes=listed["net"].tolist(), step=listed["step"].tolist())


def innermost_ranges(ranges: pd.DataFrame, memory_threads: np.ndarray, end_ns: int) -> list[tuple[int, int, int]]:
    """(pid, start_ns, end_ns) of every closed range on a memory thread that holds no other range."""
    keys = thread_key(ranges["pid"].to_numpy(), ranges["tid"].to_numpy())
    parents = ranges["parent"].to_numpy()
    leaf = ~np.isin(np.arange(len(ranges)), parents[parents >= 0])
    chosen = leaf & (ranges["end_ns"].to_numpy() < min(OPEN_END, max(end_ns, 0))) & np.isin(keys, memory_threads)
    picked = ranges[chosen]
    return list(zip(picked["pid"].tolist(), picked["start_ns"].tolist(), picked["end_ns"].tolist()))
