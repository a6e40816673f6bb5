"""The capture's facts (`Analysis.capture`): what the schema says, and the processes that made
memory events or calls, one function for the whole frame and the streamed flow."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..model import Capture, GroupSummary, Process
from ..sources.schema import Schema
from .diagnostics import crash_rerun_command, flags_used


def capture_facts(schema: Schema, groups: list[GroupSummary], thread_pairs: np.ndarray,
                  report_version: Optional[str], nvtx: bool) -> Capture:
    """The capture's facts, listing only the processes that made CUDA memory events (their
    devices: those of their groups, GroupSums') or memory calls (`thread_pairs`: pid << 24 | tid
    of each thread with memory calls, steps.memory_threads); `nvtx`: NVTX ranges were traced."""
    devices: dict[int, set] = {}
    for group in groups:
        devices.setdefault(group.pid, set()).add(group.device)
    threads: dict[int, int] = {}
    for pair in thread_pairs.tolist():
        threads[pair >> 24] = threads.get(pair >> 24, 0) + 1
    processes = [Process(pid=int(pid), name=schema.process_names.get(int(pid), ""),
                         devices=sorted(devices.get(pid, ())), threads=threads.get(pid, 0))
                 for pid in sorted(set(devices) | set(threads))]
    return Capture(
        nsys_version=schema.nsys_version, schema_version=schema.schema_version, report_version=report_version,
        duration_ns=schema.duration_ns, memory_usage_collected=schema.memory_usage_collected,
        memory_usage_requested=schema.memory_usage_requested, backtraces=schema.has_backtraces,
        nvtx=nvtx, cuda_driver_version=schema.cuda_driver_version,
        gpus=list(schema.gpus), processes=processes, flags_used=flags_used(schema),
        session_start_utc_ns=schema.session_start_utc_ns, crash_rerun_command=crash_rerun_command(schema))
