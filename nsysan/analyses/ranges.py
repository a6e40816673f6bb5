"""Memory per NVTX range name: what each phase allocates, frees, leaves behind, and the high mark."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..model import RangeStat
from .peak import resident

MAX_RANGES = 200


def range_stats(events: pd.DataFrame, ranges: pd.DataFrame, end_ns: int, limit: int = MAX_RANGES) -> list[RangeStat]:
    """Per range name: instances, time, bytes allocated/freed inside (innermost range), still live
    at the end, and the highest live GPU-resident bytes of the process while one was open."""
    if ranges.empty:
        return []
    spans = ranges.assign(end_ns=np.minimum(ranges["end_ns"].to_numpy(), max(end_ns, 0)))
    spans = spans.assign(end_ns=np.maximum(spans["end_ns"], spans["start_ns"]))
    spans["max_live"] = _max_live_while_open(events, spans)
    per_name = spans.groupby("name", sort=False).agg(
        instances=("name", "size"), total_time=("end_ns", "sum"), started=("start_ns", "sum"),
        max_live=("max_live", "max"))
    per_name["total_time"] -= per_name["started"]

    if not events.empty:
        frame = pd.DataFrame({"name": events["nvtx_range"].astype(str).to_numpy(),
                              "is_alloc": (events["op"] == "alloc").to_numpy(),
                              "bytes": events["bytes"].to_numpy(), "matched": (events["partner"] >= 0).to_numpy()})
        frame["alloc_bytes"] = np.where(frame["is_alloc"], frame["bytes"], 0)
        frame["freed_bytes"] = np.where(~frame["is_alloc"] & frame["matched"], frame["bytes"], 0)
        frame["open_bytes"] = np.where(frame["is_alloc"] & ~frame["matched"], frame["bytes"], 0)
        moved = frame.groupby("name", sort=False).agg(allocations=("is_alloc", "sum"), allocated=("alloc_bytes", "sum"),
                                                      freed=("freed_bytes", "sum"), open=("open_bytes", "sum"))
        per_name = per_name.join(moved, how="left")
    for column in ("allocations", "allocated", "freed", "open"):
        if column not in per_name:
            per_name[column] = 0
    per_name = per_name.fillna(0)
    per_name = per_name.sort_values(["allocated", "max_live", "instances"], ascending=False, kind="stable").head(limit)
    return [RangeStat(name=str(name), instances=int(r.instances), total_time_ns=int(r.total_time),
                      allocations=int(r.allocations), allocated_bytes=int(r.allocated), freed_bytes=int(r.freed),
                      still_live_bytes=int(r.open), max_live_bytes=int(max(r.max_live, 0)))
            for name, r in zip(per_name.index, per_name.itertuples())]  # one per range name


def _max_live_while_open(events: pd.DataFrame, spans: pd.DataFrame) -> np.ndarray:
    """For each range instance, the most GPU-resident bytes its process held while it was open."""
    result = np.zeros(len(spans), "int64")
    on_gpu = resident(events)
    if on_gpu.empty:
        return result
    live = on_gpu.groupby("pid", sort=False)["delta_bytes"].cumsum()
    for pid, group in on_gpu.assign(live=live.to_numpy()).groupby("pid", sort=False):  # one per process
        mine = np.flatnonzero(spans["pid"].to_numpy() == pid)
        if len(mine) == 0:
            continue
        ts = group["ts_ns"].to_numpy()
        # A sentinel 0 at the front is "live before the first event"; the sentinel at the end
        # keeps every reduceat index in range.
        values = np.concatenate([[0], group["live"].to_numpy(), [0]])
        start = np.searchsorted(ts, spans["start_ns"].to_numpy()[mine], side="right")  # value at start
        stop = np.searchsorted(ts, spans["end_ns"].to_numpy()[mine], side="right") + 1
        bounds = np.empty(2 * len(mine), "int64")
        bounds[0::2], bounds[1::2] = start, np.maximum(stop, start + 1)
        result[mine] = np.maximum.reduceat(values, bounds)[0::2]
    return result
