"""Memory API calls: counts and times per API (sizes or not), and the calls that failed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..base import apis
from ..engine import Reducer
from ..events.nvtx import attribute_ranges
from ..model import GPU_RESIDENT_KINDS, ApiCallStat, FailedCall
from ..model.memory import MAX_FAILED_CALLS
from .grouping import Segments
from .groups import batch_series

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


def failed_call_rows(calls: pd.DataFrame) -> pd.DataFrame:
    """The calls `Analysis.failed_calls` lists: the first MAX_FAILED_CALLS that returned an error
    (not counting the informational calls)."""
    if calls.empty:
        return calls
    return calls[((calls["return_value"] != 0) & (calls["family"] != "info")).to_numpy()].head(MAX_FAILED_CALLS)


class FailedCalls(Reducer):
    """`Analysis.failed_calls`: the calls of failed_call_rows, each with its NVTX range and the live
    GPU-resident bytes of its process at its time (None when no memory event was seen: sizes
    unknown). Facts.more: "failed_call_rows" (failed_call_rows of every call), "nvtx_ranges"."""

    field = "failed_calls"
    needs = ("failed_call_rows", "nvtx_ranges")

    def start(self, facts) -> None:
        super().start(facts)
        self.failed = facts.more["failed_call_rows"]
        self.pid = self.failed["pid"].to_numpy().astype("int64") if len(self.failed) else np.zeros(0, "int64")
        self.ts = self.failed["ts_ns"].to_numpy().astype("int64") if len(self.failed) else np.zeros(0, "int64")
        self.live = np.zeros(len(self.pid), "int64")
        self.carried: dict[int, int] = {}  # pid -> its GPU-resident live bytes so far
        self.resident = [i for i, kind in enumerate(facts.kinds) if kind in GPU_RESIDENT_KINDS]
        self.seen = False  # a memory event: sizes are known

    def add(self, b) -> None:
        self.seen = self.seen or len(b) > 0
        if not len(self.pid) or not len(b):
            return
        for (pid, _), rows, live in batch_series(b, self.resident, per_device=False):  # the few processes
            mine = np.flatnonzero(self.pid == pid)
            live = live + self.carried.get(pid, 0)
            self.carried[pid] = int(live[-1])
            at = np.searchsorted(b.ts[rows], self.ts[mine], side="right") - 1
            self.live[mine[at >= 0]] = live[at[at >= 0]]

    def finish(self, live: dict) -> list[FailedCall]:
        if not len(self.pid):
            return []
        nvtx, _ = attribute_ranges(self.failed, self.facts.more["nvtx_ranges"])
        failed = self.failed
        return [FailedCall(pid=int(pid), tid=int(tid), api=str(api), time_ns=int(ts), return_value=int(code),
                           error=apis.error_name(str(api), int(code)), nvtx_range=str(name),
                           live_bytes=int(held) if self.seen else None)
                for pid, tid, api, ts, code, name, held
                in zip(failed["pid"], failed["tid"], failed["api"], failed["ts_ns"], failed["return_value"],
                       np.asarray(nvtx), self.live)]  # capped list
