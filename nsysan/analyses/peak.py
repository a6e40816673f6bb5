"""Peaks: the highest live GPU-resident bytes per process and device, and per GPU."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..model import GPU_RESIDENT_KINDS, Allocation, Peak

LIVE_AT_PEAK = 20  # allocations listed per peak (largest first); live_count has them all

ToAllocations = Callable[[pd.DataFrame], list[Allocation]]


def resident(events: pd.DataFrame) -> pd.DataFrame:
    """Events of memory that sits on the GPU (device, array, static)."""
    return events[events["kind"].isin(GPU_RESIDENT_KINDS).to_numpy()]


def find_peaks(events: pd.DataFrame, gpu_of: Callable[[int, int], Optional[int]],
               total_memory: Callable[[Optional[int]], Optional[int]], to_allocations: ToAllocations) -> list[Peak]:
    """Per (process, device) peaks, then per GPU across processes (pid None) when several share one."""
    on_gpu = resident(events)
    if on_gpu.empty:
        return []
    peaks = []
    for (pid, device), group in on_gpu.groupby(["pid", "device"], sort=True):  # one per process and device
        gpu = gpu_of(int(pid), int(device))
        peaks.append(_peak_of(group, events, int(pid), int(device), gpu, total_memory(gpu), to_allocations))
    gpus = pd.Series([gpu_of(int(p), int(d)) for p, d in zip(on_gpu["pid"], on_gpu["device"])],
                     index=on_gpu.index, dtype="object")
    for gpu, group in on_gpu.groupby(gpus.to_numpy(), sort=True):  # several processes per GPU
        if group["pid"].nunique() > 1 and gpu is not None:
            peaks.append(_peak_of(group, events, None, int(gpu), int(gpu), total_memory(int(gpu)), to_allocations))
    return peaks


def _peak_of(group: pd.DataFrame, events: pd.DataFrame, pid: Optional[int], device: int,
             gpu: Optional[int], total: Optional[int], to_allocations: ToAllocations) -> Peak:
    # Events are in time order with frees first at equal times, so the running sum's first
    # maximum is the earliest moment the peak was reached.
    live = group["delta_bytes"].cumsum().to_numpy()
    at = int(np.argmax(live))
    seq = int(group.index[at])  # the event's row in the full frame: its place in time
    row = group.iloc[at]
    allocs = group[(group["op"] == "alloc").to_numpy()]
    partner = allocs["partner"].to_numpy()
    is_live = (allocs.index.to_numpy() <= seq) & ((partner < 0) | (partner > seq))
    live_now = allocs[is_live]
    largest = live_now.sort_values("bytes", ascending=False, kind="stable").head(LIVE_AT_PEAK)
    return Peak(pid=pid, device=device, gpu=gpu, peak_bytes=int(live[at]), peak_time_ns=int(row["ts_ns"]),
                nvtx_range=str(row["nvtx_range"]), api=str(row["api"]), total_memory_bytes=total,
                live_count=int(len(live_now)), live_at_peak=to_allocations(largest))


def headline(peaks: list[Peak]) -> Optional[Peak]:
    """The highest per-process peak (earliest on ties)."""
    per_process = [p for p in peaks if p.pid is not None]
    if not per_process:
        return None
    return max(per_process, key=lambda p: (p.peak_bytes, -p.peak_time_ns))
