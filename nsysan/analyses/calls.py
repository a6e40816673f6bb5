"""Memory API calls: counts and times per API (sizes or not), and the calls that failed."""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd

from ..base import apis
from ..base.cuda_errors import OUT_OF_MEMORY
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
    sums = CallStatSums(list(calls["api"].cat.categories), list(calls["family"].cat.categories))
    for chunk, family in frame_chunks(calls, CALL_CHUNK):
        sums.add(chunk, family)
    return sums.stats()


def frame_chunks(calls: pd.DataFrame, rows: int) -> Iterator[tuple[dict, np.ndarray]]:
    """The calls frame in chunks of `rows` calls, as MemoryCalls.scan hands its chunks to a sum:
    the calls' "api" (codes), "pid", "tid", "ts", "end" and "return_value", and their family codes."""
    columns = {"api": calls["api"].cat.codes.to_numpy(), "pid": calls["pid"].to_numpy(), "tid": calls["tid"].to_numpy(),
               "ts": calls["ts_ns"].to_numpy(), "end": calls["end_ns"].to_numpy(),
               "return_value": calls["return_value"].to_numpy()}
    family = calls["family"].cat.codes.to_numpy()
    for low in range(0, len(calls), max(rows, 1)):
        part = slice(low, low + rows)
        yield {name: column[part] for name, column in columns.items()}, family[part]


def allocations_with_events(calls: pd.DataFrame) -> int:
    """The successful allocation calls that caused a memory event (their `has_event`, found as the
    events were joined to their calls; the streamed flow's CallWindow counts them as it joins)."""
    succeeded = ((calls["family"] == "alloc") & (calls["return_value"] == 0)).to_numpy()
    return int((succeeded & calls["has_event"].to_numpy()).sum())


class CallStatSums:
    """api_call_stats' sums, chunk after chunk of calls in their order (the calls frame's,
    frame_chunks; the streamed flow's, each chunk MemoryCalls.scan reads)."""

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

    def add(self, calls: dict, family: np.ndarray) -> None:
        """One chunk (frame_chunks' columns): each call's API code, start, end and return value, and
        its family code."""
        seg = Segments((calls["api"].astype("int32") + 1) * self.width + family + 1, self.pairs)
        time = seg.in_group_order(calls["end"])
        time -= seg.in_group_order(calls["ts"])
        failed = seg.count(seg.in_group_order(calls["return_value"]) != 0, ordered=True)
        total, longest = seg.sum(time, ordered=True), seg.max(time, ordered=True)
        for k in np.flatnonzero(seg.present).tolist():  # the pairs in this chunk
            first = self.rows + int(seg.order[seg.starts[k]])  # the stable order keeps each pair's rows in order
            entry = self.found.setdefault(k, [first, 0, 0, 0, int(longest[k])])
            entry[1] += int(seg.sizes[k])
            entry[2] += int(failed[k])
            entry[3] += int(total[k])
            entry[4] = max(entry[4], int(longest[k]))
        self.rows += len(family)

    def stats(self) -> list[ApiCallStat]:
        ordered = sorted(self.found.items(), key=lambda item: item[1][0])  # as pandas' groupby(sort=False) lists them
        ordered.sort(key=lambda item: (-item[1][1], -item[1][3]))  # most calls, then most time (stable)
        width = self.width
        return [ApiCallStat(api=str(self.api_names[k // width - 1]), family=str(self.families[k % width - 1]),
                            calls=calls_, failed=failed_, total_time_ns=total, max_time_ns=longest)
                for k, (_, calls_, failed_, total, longest) in ordered]


class CallOutcomes:
    """How the memory API calls ended, chunk after chunk of them in their order (the whole calls
    frame is one chunk, call_outcomes; the streamed flow's are the chunks MemoryCalls.scan reads):
    the first MAX_FAILED_CALLS that returned an error, not counting the informational calls
    (`failed`: the rows `Analysis.failed_calls` lists), how many of all of those ran out of memory
    (`out_of_memory`), and the successful cuMemCreate calls per process (`created_by_pid`)."""

    def __init__(self, api_names: list[str], families: list[str]) -> None:
        self.api_names = np.array(api_names, dtype=object)
        self.info = families.index("info") if "info" in families else -1
        self.create = api_names.index("cuMemCreate") if "cuMemCreate" in api_names else -1
        self.parts: list[pd.DataFrame] = []
        self.found = 0  # failed calls kept so far
        self.out_of_memory = 0
        self.created_by_pid: dict[int, int] = {}

    def add(self, calls: dict, family: np.ndarray) -> None:
        """One chunk: frame_chunks' columns, and each call's family code."""
        code = calls["return_value"]
        refused = (code != 0) & (family != self.info)
        self.out_of_memory += int((refused & (code == OUT_OF_MEMORY)).sum())
        if self.found < MAX_FAILED_CALLS:
            rows = np.flatnonzero(refused)[:MAX_FAILED_CALLS - self.found]
            self.found += len(rows)
            self.parts.append(pd.DataFrame({
                "ts_ns": calls["ts"][rows], "pid": calls["pid"][rows], "tid": calls["tid"][rows],
                "api": self.api_names[calls["api"][rows]], "return_value": code[rows], "end_ns": calls["end"][rows]}))
        if self.create >= 0:  # physical memory made, per process (verdicts' vmm_without_access)
            made = calls["pid"][(calls["api"] == self.create) & (code == 0)]
            for pid, count in zip(*np.unique(made, return_counts=True)):
                self.created_by_pid[int(pid)] = self.created_by_pid.get(int(pid), 0) + int(count)

    @property
    def failed(self) -> pd.DataFrame:
        parts = [part for part in self.parts if len(part)]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def call_outcomes(calls: pd.DataFrame) -> CallOutcomes:
    """CallOutcomes of the calls frame, as one chunk."""
    outcomes = CallOutcomes(list(calls["api"].cat.categories), list(calls["family"].cat.categories))
    for chunk, family in frame_chunks(calls, len(calls)):
        outcomes.add(chunk, family)
    return outcomes


class FailedCalls(Reducer):
    """`Analysis.failed_calls`: the failed calls (CallOutcomes), each with its NVTX range and the live
    GPU-resident bytes of its process at its time (None when no memory event was seen: sizes
    unknown). Facts.more: "failed_call_rows" (CallOutcomes.failed), "nvtx_ranges"."""

    field = "failed_calls"
    needs = ("failed_call_rows", "nvtx_ranges")

    def start(self, facts) -> None:
        super().start(facts)
        self.failed = facts.more["failed_call_rows"]
        self.pid, self.ts = (np.asarray(self.failed.get(column, ()), "int64") for column in ("pid", "ts_ns"))
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
