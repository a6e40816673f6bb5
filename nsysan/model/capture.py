"""What a report is: the source file, the capture's facts (GPUs, processes, what was
collected), the diagnostics, and the constants that name memory kinds and severities."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

SCHEMA_ID = "nsysan/analysis@1"

# The API and site of a block already live when a capture that began while the program ran
# started (--capture-range, --delay): nsys writes one allocation row at time 0 for each, joined to
# no call of the capture; who allocated it, where and when is not in the capture.
LIVE_AT_START = "(live at capture start)"

# The memory kinds of the events frame, in the order they are shown.
KINDS = ("device", "array", "static", "managed", "managed_static", "pinned", "pageable", "unknown")
# Kinds that occupy memory on the GPU itself: the "device memory" of a process's peak.
# Managed memory lives on the GPU only while migrated there, pinned and pageable memory are
# host memory; they get their own groups and are not added to the device peak.
GPU_RESIDENT_KINDS = ("device", "array", "static")

SEVERITIES = ("error", "warning", "info")
# Diagnostics that say the numbers themselves may be wrong or incomplete (not findings such as a
# failed call): outputs spell these out first, next to the answer.
TRUST_BREAKING = ("partial_export", "nsys_diagnostic", "bad_memory_rows", "overlapping_allocations",
                  "allocated_before_capture", "cuda_trace_incomplete", "no_cuda_trace", "no_memory_events",
                  "nsys_older_than_cuda", "sizes_not_collected", "quick")


@dataclass(frozen=True)
class Diagnostic:
    """A problem that weakens the numbers without stopping the analysis."""

    severity: str  # error | warning | info
    code: str  # stable identifier, e.g. "no_memory_table"
    message: str  # one or two sentences a user can act on


# Every code a Diagnostic may have (docs/analyses.md#diagnostics lists them, with what raises
# each; tests/test_hostile3.py checks that the two lists agree). `check --no-warnings` refuses
# any other: a misspelled code would never match, and the gate would pass what it should stop.
DIAGNOSTIC_CODES = frozenset({
    "allocated_before_capture", "allocation_failed", "ended_inside", "oom_log_empty", "oom_logged", "allocations_without_events", "allocator_oom_suspected",
    "bad_memory_rows", "bad_time_shift", "cache_flushes", "caching_allocator", "cuda_trace_incomplete",
    "live_at_capture_start", "long_strings", "memory_growth", "memory_kept_unevenly", "near_capacity", "no_backtraces", "no_cuda_trace",
    "no_memory_events", "no_steps", "not_streamed", "nvtx_not_traced", "nsys_diagnostic", "nsys_older_than_cuda",
    "overlapping_allocations", "partial_export", "preallocation", "probe", "python_stacks_not_exported",
    "python_stacks_unreadable", "quick", "run_cut_short", "sibling_export", "sibling_export_damaged",
    "sizes_not_collected", "smi_clock_offset", "smi_no_overlap", "smi_no_start_time", "smi_other_gpu",
    "smi_rows_skipped", "static_memory", "virtual_memory_api", "vmm_without_access",
})


@dataclass(frozen=True)
class Source:
    """The file the user gave and how it was read."""

    path: str
    name: str
    format: str  # sqlite | nsys-rep | qdrep
    size_bytes: int
    exported_with: Optional[str] = None  # nsys version that exported it for this run, if any
    from_cache: bool = False  # the export came from nsysan's cache
    # The report's own export found beside it (<stem>.sqlite) and read in its place, if any
    sibling_export: Optional[str] = None

    def named(self, path: object) -> "Source":
        """This source, as the file at `path` (the same bytes found under another name)."""
        return dataclasses.replace(self, path=path_text(path), name=path_text(getattr(path, "name", path)))


def path_text(path: object) -> str:
    """A file name as text every output can hold: bytes that are not UTF-8 (lone surrogates in
    Python, which no UTF-8 file or JSON parser takes) become U+FFFD, like a profile's strings."""
    return str(path).encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(frozen=True)
class Gpu:
    id: int  # GPU id in the capture (TARGET_INFO_GPU.id)
    name: str
    total_memory_bytes: Optional[int]
    uuid: Optional[str] = None
    bus: Optional[str] = None


@dataclass(frozen=True)
class Process:
    pid: int
    name: str
    devices: list[int] = field(default_factory=list)  # CUDA device ordinals it used
    threads: int = 0  # threads that made CUDA memory calls
    # Its place in a multi-process job: from RANK/LOCAL_RANK/WORLD_SIZE (or the Open MPI, Slurm,
    # PMI equivalents) of its recorded environment, else from the order of the GPUs the processes
    # hold memory on. None for a single process or a process with no GPU memory of its own.
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    world_size: Optional[int] = None
    rank_source: Optional[str] = None  # "environment" | "gpu order" | None
    label: str = ""  # how outputs name it: "rank 1", or "process 2147"


@dataclass(frozen=True)
class Capture:
    """Facts about the capture and the export, and what was collected."""

    nsys_version: Optional[str]  # product version that wrote the export
    schema_version: Optional[str]  # export schema version (e.g. 3.20.3)
    report_version: Optional[str]  # version that captured the report, when it could be read
    duration_ns: Optional[int]
    memory_usage_collected: bool  # CUDA_GPU_MEMORY_USAGE_EVENTS is present (sizes are known)
    memory_usage_requested: Optional[bool]  # --cuda-memory-usage as recorded, None if not recorded
    backtraces: bool  # CUDA API call stacks (--cudabacktrace) are present
    nvtx: bool  # NVTX ranges are present
    cuda_driver_version: Optional[str]
    gpus: list[Gpu] = field(default_factory=list)
    processes: list[Process] = field(default_factory=list)
    # the nsys flags nsysan's advice names that the capture recorded using (--cuda-memory-usage=true,
    # --cudabacktrace=memory, -s process-tree, --python-backtrace=cuda); None: not recorded (before 2023)
    flags_used: Optional[list[str]] = None
    # when the capture's time 0 was (TARGET_INFO_SESSION_START_TIME), UTC epoch ns: reports of one
    # job, one per rank, are put on one clock with it (batch's fleet view); None: not recorded
    session_start_utc_ns: Optional[int] = None
    # the `nsys profile` line to run instead after a run that may have crashed (the capture's own
    # program and traces, the memory flags, CUDA buffers written every 100 ms unless the capture
    # already wrote them at an interval): what answers about a run cut short end with; "": none
    crash_rerun_command: str = ""
