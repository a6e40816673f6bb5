"""Peaks: the highest live GPU-resident bytes per process and device, and per GPU."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..events.arrays import category_codes, distinct_pairs
from ..model import GPU_RESIDENT_KINDS, Allocation, AllocationGroup, Holder, Peak
from .pools import ReserveChanges, reserve_at
from .stacks import stack_bytes

LIVE_AT_PEAK = 20  # allocations listed per peak (largest first); live_count has them all
MADE_OF = 5  # (site, range) pairs listed per peak

ToAllocations = Callable[[pd.DataFrame], list[Allocation]]
ToGroups = Callable[[np.ndarray], list[AllocationGroup]]  # alloc rows -> grouped by site and range


def resident_rows(events: pd.DataFrame) -> np.ndarray:
    """Rows of memory that sits on the GPU (device, array, static), in time order."""
    return np.flatnonzero(events["kind"].isin(GPU_RESIDENT_KINDS).to_numpy())


def find_peaks(events: pd.DataFrame, gpu_of: Callable[[int, int], Optional[int]],
               total_memory: Callable[[Optional[int]], Optional[int]], to_allocations: ToAllocations,
               reserve_changes: Optional[ReserveChanges] = None,
               to_groups: Optional[ToGroups] = None) -> list[Peak]:
    """Per (process, device) peaks, then per GPU across processes (pid None) when several share one.

    `reserve_changes` (see pools.reserve_adjustment) add the unused reserve of stream-ordered
    memory pools to the live bytes: a pool holds what it reserved."""
    rows = resident_rows(events)
    if len(rows) == 0:
        return []
    pid = events["pid"].to_numpy()[rows]
    device = events["device"].to_numpy()[rows]
    # Distinct (pid, device) pairs packed into one integer each: a hash pass, not a frame's.
    packed = distinct_pairs(pid, device, 16, 0xFFFF).tolist()
    pairs = sorted((p >> 16, (p & 0xFFFF) - 0x10000 if p & 0x8000 else p & 0xFFFF) for p in packed)
    gpu_by_pair = {(p, d): gpu_of(p, d) for p, d in pairs}
    is_static = (events["kind"] == "static").to_numpy()[rows]
    computes_on = set(pd.unique(pid[~is_static]).tolist())  # a hash pass, not a sort of 1e7 pids
    peaks = []
    for (p, d), gpu in gpu_by_pair.items():  # one per process and device
        mine = (pid == p) & (device == d)
        if p in computes_on and is_static[mine].all():
            # Only module globals, loaded into every context the process opens (ddp_leak_v25's
            # rank 1 on GPU 0), while it allocates on another GPU: not a peak of its own; they
            # still count in that GPU's total.
            continue
        mine = rows[mine]
        peaks.append(_peak_of(mine, events, p, d, gpu, total_memory(gpu), to_allocations, reserve_changes,
                              to_groups))
    sharing: dict[int, list[tuple[int, int]]] = {}
    for (p, d), gpu in gpu_by_pair.items():
        if gpu is not None:
            sharing.setdefault(gpu, []).append((p, d))
    for gpu, members in sorted(sharing.items()):  # several processes on one GPU
        if len({p for p, _ in members}) > 1:
            on_gpu = np.zeros(len(rows), bool)
            for p, d in members:
                on_gpu |= (pid == p) & (device == d)
            peaks.append(_peak_of(rows[on_gpu], events, None, gpu, gpu, total_memory(gpu), to_allocations,
                                  reserve_changes, to_groups))
    return peaks


def _peak_of(rows: np.ndarray, events: pd.DataFrame, pid: Optional[int], device: int,
             gpu: Optional[int], total: Optional[int], to_allocations: ToAllocations,
             reserve_changes: Optional[ReserveChanges] = None, to_groups: Optional[ToGroups] = None) -> Peak:
    # Rows are in time order with frees first at equal times, so the running sum's first
    # maximum is the earliest moment the peak was reached.
    delta = events["delta_bytes"].to_numpy()[rows]
    reserve = reserve_at(rows, reserve_changes) if reserve_changes is not None else None
    live = np.cumsum(delta) + reserve if reserve is not None else np.cumsum(delta)
    at = int(np.argmax(live))
    seq = int(rows[at])  # the event's row in the full frame: its place in time
    is_alloc = (category_codes(events["op"])[rows] == 0)
    partner = events["partner"].to_numpy()[rows]
    live_now = rows[is_alloc & (rows <= seq) & ((partner < 0) | (partner > seq))]
    sizes = events["bytes"].to_numpy()[live_now]
    largest = live_now[np.argsort(-sizes, kind="stable")[:LIVE_AT_PEAK]]
    return Peak(made_of=made_of(events, live_now), pid=pid, device=device, gpu=gpu, peak_bytes=int(live[at]),
                peak_time_ns=_reached(seq, int(events["ts_ns"].iat[seq]), reserve_changes,
                                      bool(events["pool"].iat[seq])),
                nvtx_range=str(events["nvtx_range"].iat[seq]),
                api=str(events["api"].iat[seq]), total_memory_bytes=total, live_count=int(len(live_now)),
                live_at_peak=to_allocations(events.iloc[largest]),
                pool_reserve_bytes=int(reserve[at]) if reserve is not None else 0,
                live_groups=to_groups(live_now) if to_groups else [], live_stacks=stack_bytes(events, live_now))


def _reached(seq: int, ts: int, reserve_changes: Optional[ReserveChanges], is_pool: bool) -> int:
    """When the level at event row `seq` (at `ts`) was first reached: earlier than the event when
    it is a pool's allocation and the pool's reserve made the level before it (pools.reached_before;
    streamed_second.SecondLook._peaks does the same)."""
    if reserve_changes is None or not is_pool or not len(reserve_changes[0]):
        return ts
    at = int(np.searchsorted(reserve_changes[0], seq))
    if at < len(reserve_changes[0]) and reserve_changes[0][at] == seq and reserve_changes[2][at] >= 0:
        return int(reserve_changes[2][at])
    return ts


def made_of(events: pd.DataFrame, rows: np.ndarray, limit: int = MADE_OF) -> list[Holder]:
    """The live allocations `rows` summed by call site, largest first; a site's NVTX range is named
    when all its allocations share one."""
    if len(rows) == 0:
        return []
    # Category codes, not strings: a peak of a large capture has 1e5 allocations live.
    site, name = events["site"], events["nvtx_range"]
    site_codes = category_codes(site)[rows].astype("int64")
    name_codes = category_codes(name)[rows].astype("int64")
    sizes = events["bytes"].to_numpy()[rows]
    present, slot = np.unique(site_codes, return_inverse=True)
    totals = np.zeros(len(present), "int64")
    np.add.at(totals, slot, sizes)
    counts = np.bincount(slot, minlength=len(present))
    pairs = np.unique(slot.astype("int64") << 32 | (name_codes & 0xFFFFFFFF))
    names_per_site = np.bincount((pairs >> 32).astype("int64"), minlength=len(present))
    first_name = name_codes[np.unique(slot, return_index=True)[1]]
    result = []
    for i in np.argsort(-totals, kind="stable")[:limit]:  # capped
        code = int(first_name[i])
        result.append(Holder(site=str(site.cat.categories[present[i]]) if present[i] >= 0 else "",
                             nvtx_range=str(name.cat.categories[code]) if names_per_site[i] == 1 and code >= 0 else "",
                             bytes=int(totals[i]), allocations=int(counts[i])))
    return result


def headline(peaks: list[Peak]) -> Optional[Peak]:
    """The highest per-process peak (earliest on ties)."""
    per_process = [p for p in peaks if p.pid is not None]
    if not per_process:
        return None
    return max(per_process, key=lambda p: (p.peak_bytes, -p.peak_time_ns))
