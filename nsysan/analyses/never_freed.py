"""Allocations not freed by the end of the capture, and the per-group totals."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..model import Allocation, GroupSummary
from .timeline import GROUP, live_bytes

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


def summarize_groups(events: pd.DataFrame, gpu_of: Callable[[int, int], Optional[int]]) -> list[GroupSummary]:
    """Totals per (process, device, kind): peak, end value, counts, never freed, frees without alloc."""
    if events.empty:
        return []
    frame = events[GROUP + ["op", "partner", "bytes", "ts_ns"]].assign(
        live=live_bytes(events),
        is_alloc=(events["op"] == "alloc").to_numpy(),
        kind=events["kind"].astype(str).to_numpy())
    frame["alloc_bytes"] = np.where(frame["is_alloc"], frame["bytes"], 0)
    frame["open"] = frame["is_alloc"] & (frame["partner"] < 0)
    frame["open_bytes"] = np.where(frame["open"], frame["bytes"], 0)
    frame["orphan"] = ~frame["is_alloc"] & (frame["partner"] < 0)
    frame["orphan_bytes"] = np.where(frame["orphan"], frame["bytes"], 0)
    grouped = frame.groupby(GROUP, sort=True)
    totals = grouped.agg(allocations=("is_alloc", "sum"), events=("is_alloc", "size"),
                         allocated_bytes=("alloc_bytes", "sum"), never_freed_count=("open", "sum"),
                         never_freed_bytes=("open_bytes", "sum"), orphans=("orphan", "sum"),
                         orphan_bytes=("orphan_bytes", "sum"), end_bytes=("live", "last"),
                         peak_bytes=("live", "max"))
    first_peak = frame.loc[grouped["live"].idxmax().to_numpy(), GROUP + ["ts_ns", "live"]]
    first_peak = first_peak.set_index(GROUP)["ts_ns"]
    summaries = []
    for key, row in totals.iterrows():  # one per group
        pid, device, kind = key
        peak = int(max(row["peak_bytes"], 0))
        summaries.append(GroupSummary(
            pid=int(pid), device=int(device), kind=str(kind), gpu=gpu_of(int(pid), int(device)),
            peak_bytes=peak, peak_time_ns=int(first_peak.loc[key]) if peak > 0 else None,
            end_bytes=int(row["end_bytes"]), allocations=int(row["allocations"]),
            frees=int(row["events"] - row["allocations"]), allocated_bytes=int(row["allocated_bytes"]),
            never_freed_bytes=int(row["never_freed_bytes"]), never_freed_count=int(row["never_freed_count"]),
            frees_without_alloc=int(row["orphans"]), frees_without_alloc_bytes=int(row["orphan_bytes"])))
    return summaries
