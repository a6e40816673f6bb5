"""Allocations not freed by the end of the capture, and the per-group totals."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..model import Allocation, GroupSummary
from .timeline import Groups

# Module globals (`__device__` variables) are loaded once and never freed: static memory, not
# leaks. They are counted in their own group instead.
NOT_LEAKS = ("static", "managed_static")
MAX_LISTED = 500


def never_freed_rows(events: pd.DataFrame) -> pd.DataFrame:
    """Alloc events with no free in the capture (static memory excluded), largest first."""
    rows = events[((events["op"] == "alloc") & (events["partner"] < 0) & ~events["kind"].isin(NOT_LEAKS)).to_numpy()]
    return rows.sort_values(["bytes", "ts_ns"], ascending=[False, True], kind="stable")


def find_never_freed(events: pd.DataFrame,
                     to_allocations: Callable[[pd.DataFrame], list[Allocation]]) -> tuple[list[Allocation], int]:
    """The never-freed allocations (at most MAX_LISTED, largest first) and how many there are."""
    rows = never_freed_rows(events)
    return to_allocations(rows.head(MAX_LISTED)), int(len(rows))


def summarize_groups(events: pd.DataFrame, groups: Groups,
                     gpu_of: Callable[[int, int], Optional[int]]) -> list[GroupSummary]:
    """Totals per (process, device, kind): peak, end value, counts, never freed, frees without alloc."""
    if events.empty:
        return []
    seg = groups.segments
    # Each column brought into segment order once (one gather each, not one per sum), like the live bytes.
    is_alloc = seg.in_group_order(events["op"].cat.codes.to_numpy() == 0)
    unmatched = seg.in_group_order(events["partner"].to_numpy() < 0)
    sizes = seg.in_group_order(events["bytes"].to_numpy())
    allocations = seg.count(is_alloc, ordered=True)
    frees = seg.count() - allocations
    allocated = seg.sum(np.where(is_alloc, sizes, 0), ordered=True)
    never_freed_count = seg.count(is_alloc & unmatched, ordered=True)
    never_freed_bytes = seg.sum(np.where(is_alloc & unmatched, sizes, 0), ordered=True)
    orphans = seg.count(~is_alloc & unmatched, ordered=True)
    orphan_bytes = seg.sum(np.where(~is_alloc & unmatched, sizes, 0), ordered=True)
    del is_alloc, unmatched, sizes
    end_bytes = seg.last(groups.live, ordered=True)
    peak_bytes = seg.max(groups.live, ordered=True)
    # Events are in time order, so the first row holding a group's maximum is when it was reached.
    first_peak_ts = events["ts_ns"].to_numpy()[np.maximum(seg.first_row_of_max(groups.live, ordered=True), 0)]
    totals = pd.DataFrame({"allocations": allocations, "frees": frees, "allocated_bytes": allocated,
                           "never_freed_count": never_freed_count, "never_freed_bytes": never_freed_bytes,
                           "orphans": orphans, "orphan_bytes": orphan_bytes, "end_bytes": end_bytes,
                           "peak_bytes": peak_bytes})
    summaries = []
    for (pid, device, kind), row, peak_ts in zip(groups.keys.itertuples(index=False), totals.itertuples(),
                                                 first_peak_ts):  # one per group
        peak = int(max(row.peak_bytes, 0))
        summaries.append(GroupSummary(
            pid=int(pid), device=int(device), kind=str(kind), gpu=gpu_of(int(pid), int(device)),
            peak_bytes=peak, peak_time_ns=int(peak_ts) if peak > 0 else None,
            end_bytes=int(row.end_bytes), allocations=int(row.allocations),
            frees=int(row.frees), allocated_bytes=int(row.allocated_bytes),
            never_freed_bytes=int(row.never_freed_bytes), never_freed_count=int(row.never_freed_count),
            frees_without_alloc=int(row.orphans), frees_without_alloc_bytes=int(row.orphan_bytes)))
    return summaries
