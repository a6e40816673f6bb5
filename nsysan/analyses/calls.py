"""Memory API calls: counts and times per API (sizes or not), and the calls that failed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import apis
from ..events.nvtx import attribute_ranges
from ..model import ApiCallStat, FailedCall
from .peak import resident_rows

MAX_FAILED = 1000


def api_call_stats(calls: pd.DataFrame) -> list[ApiCallStat]:
    """Per memory API: calls, failures, total and longest time; most called first."""
    if calls.empty:
        return []
    frame = pd.DataFrame({"api": calls["api"].cat.codes.to_numpy(), "family": calls["family"].cat.codes.to_numpy(),
                          "failed": (calls["return_value"] != 0).to_numpy(),
                          "time": (calls["end_ns"] - calls["ts_ns"]).to_numpy()})
    stats = frame.groupby(["api", "family"], sort=False).agg(calls=("failed", "size"), failed=("failed", "sum"),
                                                              total=("time", "sum"), longest=("time", "max"))
    stats = stats.sort_values(["calls", "total"], ascending=False, kind="stable")
    api_names, families = calls["api"].cat.categories, calls["family"].cat.categories
    return [ApiCallStat(api=str(api_names[api]), family=str(families[family]), calls=int(r.calls),
                        failed=int(r.failed), total_time_ns=int(r.total), max_time_ns=int(r.longest))
            for (api, family), r in zip(stats.index, stats.itertuples())]


def find_failed_calls(calls: pd.DataFrame, events: pd.DataFrame, ranges: pd.DataFrame) -> list[FailedCall]:
    """Memory API calls that returned an error, with the NVTX range and live bytes at that moment."""
    if calls.empty:
        return []
    failed = calls[((calls["return_value"] != 0) & (calls["family"] != "info")).to_numpy()].head(MAX_FAILED)
    if failed.empty:
        return []
    nvtx, _ = attribute_ranges(failed, ranges)
    live = _live_at(failed, events)
    return [FailedCall(pid=int(pid), tid=int(tid), api=str(api), time_ns=int(ts), return_value=int(code),
                       error=apis.error_name(str(api), int(code)), nvtx_range=str(name),
                       live_bytes=None if lb < 0 else int(lb))
            for pid, tid, api, ts, code, name, lb
            in zip(failed["pid"], failed["tid"], failed["api"], failed["ts_ns"], failed["return_value"],
                   np.asarray(nvtx), live)]  # capped list


def _live_at(points: pd.DataFrame, events: pd.DataFrame) -> np.ndarray:
    """Live GPU-resident bytes of each point's process at its time (-1 when sizes are unknown)."""
    result = np.full(len(points), -1, "int64")
    if events.empty:
        return result
    rows = resident_rows(events)
    result[:] = 0
    event_pid = events["pid"].to_numpy()[rows]
    for pid in np.unique(points["pid"].to_numpy()):  # one per process
        mine = np.flatnonzero(points["pid"].to_numpy() == pid)
        theirs = rows[event_pid == pid]
        if len(theirs) == 0:
            continue
        live = np.cumsum(events["delta_bytes"].to_numpy()[theirs])
        at = np.searchsorted(events["ts_ns"].to_numpy()[theirs], points["ts_ns"].to_numpy()[mine], side="right") - 1
        result[mine] = np.where(at >= 0, live[np.maximum(at, 0)], 0)
    return result
