"""The capture's facts (`Analysis.capture`): what the schema says, and the processes that made
memory events or calls, one function for the whole frame and the streamed flow; and the span of
the events' times (EventSpan), one reducer for both."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..engine import Reducer
from ..events.arrays import HIGH, LOW
from ..events.batch import EventBatch
from ..model import Capture, GroupSummary, Process
from ..sources.schema import Schema
from .diagnostics import flags_used, rerun_command
from .ranks import assign_ranks


def capture_facts(schema: Schema, groups: list[GroupSummary], thread_pairs: np.ndarray,
                  report_version: Optional[str], nvtx: bool) -> Capture:
    """The capture's facts, listing only the processes that made CUDA memory events (their
    devices: those of their groups, GroupSums') or memory calls (`thread_pairs`: pid << 24 | tid
    of each thread with memory calls, steps.memory_threads), with their ranks; `nvtx`: NVTX
    ranges were traced."""
    devices: dict[int, set] = {}
    for group in groups:
        devices.setdefault(group.pid, set()).add(group.device)
    threads = Counter(pair >> 24 for pair in thread_pairs.tolist())  # pid -> its threads
    processes = [Process(pid=int(pid), name=schema.process_names.get(int(pid), ""),
                         devices=sorted(devices.get(pid, ())), threads=threads.get(pid, 0))
                 for pid in sorted(set(devices) | set(threads))]
    processes = assign_ranks(processes, groups, schema.rank_environment, schema.launched_pids)
    return Capture(
        nsys_version=schema.nsys_version, schema_version=schema.schema_version, report_version=report_version,
        duration_ns=schema.duration_ns, memory_usage_collected=schema.memory_usage_collected,
        memory_usage_requested=schema.memory_usage_requested, backtraces=schema.has_backtraces,
        nvtx=nvtx, cuda_driver_version=schema.cuda_driver_version,
        gpus=list(schema.gpus), processes=processes, flags_used=flags_used(schema),
        session_start_utc_ns=schema.session_start_utc_ns, crash_rerun_command=rerun_command(schema, crash=True))


FINITE = np.iinfo("int64").max // 4  # later times are no time (a range left open has a huge end)


@dataclass
class Span:
    """The earliest and latest time of the events, and the latest that is finite (below FINITE);
    None without events. `capture`: (first, last finite), for capture_span."""

    first_ts: Optional[int] = None
    last_ts: Optional[int] = None
    last_finite_ts: Optional[int] = None

    @property
    def capture(self) -> tuple[Optional[int], Optional[int]]:
        return self.first_ts, self.last_finite_ts


def capture_span(duration_ns: Optional[int], *spans: tuple[Optional[int], Optional[int]]) -> tuple[int, int]:
    """The capture's span: from 0 or the earliest start to its end (`duration_ns`) or the latest
    end of `spans` ((start, end) of the events, calls and ranges; None: none)."""
    return (min([0] + [start for start, _ in spans if start is not None]),
            max([duration_ns or 0] + [end for _, end in spans if end is not None]))


def frame_span(frame, start: str, end: str) -> tuple[Optional[int], Optional[int]]:
    """The earliest `start` and latest finite `end` of a frame's rows (the calls', the ranges')."""
    finite = frame[end][frame[end] < FINITE] if not frame.empty else frame[end]
    return (int(frame[start].min()) if not frame.empty else None, int(finite.max()) if not finite.empty else None)


class EventSpan(Reducer):
    """The span of the events' times (`Span`): the capture's span starts at the first and ends at
    the last finite one at least (with the calls' and ranges'), and the NVTX ranges' lookups span
    the first to the last (events.nvtx.RangeLookup). Each batch is in time order."""

    field = "event_span"

    def start(self, facts) -> None:
        super().start(facts)
        self.first, self.last, self.last_finite = HIGH, LOW, LOW

    def add(self, b: EventBatch) -> None:
        if not len(b):
            return
        self.first, self.last = min(self.first, int(b.ts[0])), max(self.last, int(b.ts[-1]))
        finite = int(np.searchsorted(b.ts, FINITE, side="left"))
        if finite:
            self.last_finite = max(self.last_finite, int(b.ts[finite - 1]))

    def finish(self, live: dict) -> Span:
        if self.last == LOW:
            return Span()
        return Span(self.first, self.last, self.last_finite if self.last_finite != LOW else None)


def gpus(schema: Schema) -> tuple:
    """(gpu_of(pid, device), total_memory(gpu)) of a capture: the GPU of a process's CUDA device
    (None when unknown) and a GPU's memory (None when unknown), for both orchestrators."""
    gpu_totals = {g.id: g.total_memory_bytes for g in schema.gpus}

    def gpu_of(pid: int, device: int) -> Optional[int]:
        # Without TARGET_INFO_CUDA_DEVICE (before 3.16.4) the ordinal is the GPU id, which holds
        # unless CUDA_VISIBLE_DEVICES differs between processes.
        if schema.cuda_device_to_gpu:
            return schema.cuda_device_to_gpu.get((pid, device))
        return device if device in gpu_totals or not gpu_totals else None

    def total_memory(gpu: Optional[int]) -> Optional[int]:
        return gpu_totals.get(gpu) if gpu is not None else None

    return gpu_of, total_memory
