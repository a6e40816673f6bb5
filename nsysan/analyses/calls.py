"""Memory API calls: counts and times per API (sizes or not), and the calls that failed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..base import apis
from ..events.nvtx import attribute_ranges
from ..model import ApiCallStat, FailedCall
from ..model.memory import MAX_FAILED_CALLS
from .grouping import Segments
from .peak import resident_rows

# Calls summed at a time: a chunk's durations and masks stay small beside the calls frame.
CALL_CHUNK = 1 << 20


def api_call_stats(calls: pd.DataFrame) -> list[ApiCallStat]:
    """Per memory API: calls, failures, total and longest time; most called first (ties: the API
    called first comes first)."""
    if calls.empty:
        return []
    sums = CallStatSums(list(calls["api"].cat.categories), list(calls["family"].cat.categories))
    api, family = calls["api"].cat.codes.to_numpy(), calls["family"].cat.codes.to_numpy()
    ts, end, code = calls["ts_ns"].to_numpy(), calls["end_ns"].to_numpy(), calls["return_value"].to_numpy()
    for low in range(0, len(calls), CALL_CHUNK):
        part = slice(low, low + CALL_CHUNK)
        sums.add(api[part], family[part], ts[part], end[part], code[part])
    return sums.stats()


class CallStatSums:
    """api_call_stats' sums, chunk after chunk of calls in the calls frame's order (also a flow of
    chunks read from the export: analyses/streamed_full.py hands it each chunk MemoryCalls.scan reads)."""

    def __init__(self, api_names: list[str], families: list[str]) -> None:
        self.api_names, self.families = api_names, families
        # (API, family) as one small code; a few dozen pairs at most, each summed exactly in int64
        # over a chunk at a time (a frame of 1e7 durations and pandas' groupby took 0.4 GB at 1e7
        # calls), the chunk sorted into pairs by a counting sort and each pair reduced once (not
        # one pass over the chunk per pair: 0.55 -> 0.2 s at 1e7 calls).
        self.width = len(families) + 1
        self.pairs = (len(api_names) + 1) * self.width
        self.rows = 0
        self.found: dict[int, list[int]] = {}  # key -> [first row, calls, failed, total, longest]

    def add(self, api: np.ndarray, family: np.ndarray, ts: np.ndarray, end: np.ndarray, code: np.ndarray) -> None:
        """One chunk: each call's API and family codes, start, end and return value."""
        seg = Segments((api.astype("int32") + 1) * self.width + family + 1, self.pairs)
        time = seg.in_group_order(end)
        time -= seg.in_group_order(ts)
        failed = seg.count(seg.in_group_order(code) != 0, ordered=True)
        total, longest = seg.sum(time, ordered=True), seg.max(time, ordered=True)
        for k in np.flatnonzero(seg.present).tolist():  # the pairs in this chunk
            first = self.rows + int(seg.order[seg.starts[k]])  # the stable order keeps each pair's rows in order
            entry = self.found.setdefault(k, [first, 0, 0, 0, int(longest[k])])
            entry[1] += int(seg.sizes[k])
            entry[2] += int(failed[k])
            entry[3] += int(total[k])
            entry[4] = max(entry[4], int(longest[k]))
        self.rows += len(api)

    def stats(self) -> list[ApiCallStat]:
        ordered = sorted(self.found.items(), key=lambda item: item[1][0])  # as pandas' groupby(sort=False) lists them
        ordered.sort(key=lambda item: (-item[1][1], -item[1][3]))  # most calls, then most time (stable)
        width = self.width
        return [ApiCallStat(api=str(self.api_names[k // width - 1]), family=str(self.families[k % width - 1]),
                            calls=calls_, failed=failed_, total_time_ns=total, max_time_ns=longest)
                for k, (_, calls_, failed_, total, longest) in ordered]


def find_failed_calls(calls: pd.DataFrame, events: pd.DataFrame, ranges: pd.DataFrame) -> list[FailedCall]:
    """Memory API calls that returned an error, with the NVTX range and live bytes at that moment."""
    failed = failed_call_rows(calls)
    if failed.empty:
        return []
    return failed_call_list(failed, _live_at(failed, events), ranges)


def failed_call_rows(calls: pd.DataFrame) -> pd.DataFrame:
    """The calls find_failed_calls lists: the first MAX_FAILED_CALLS that returned an error (not
    counting the informational calls)."""
    if calls.empty:
        return calls
    return calls[((calls["return_value"] != 0) & (calls["family"] != "info")).to_numpy()].head(MAX_FAILED_CALLS)


def failed_call_list(failed: pd.DataFrame, live: np.ndarray, ranges: pd.DataFrame) -> list[FailedCall]:
    """failed_call_rows as FailedCalls, with the live bytes of each one's process then (`live`,
    -1 when sizes are unknown) and its NVTX range."""
    if failed.empty:
        return []
    nvtx, _ = attribute_ranges(failed, ranges)
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
