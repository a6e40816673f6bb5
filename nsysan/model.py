"""The result model: plain frozen dataclasses, serialized to the JSON schema "nsysan/analysis@1".

Everything a user sees (terminal, JSON, HTML, PNG) is drawn from an `Analysis`; `compare`,
`check` and `batch` can start from its JSON, so `to_dict()` / `from_dict()` round-trip exactly.
Field names carry their units: `*_bytes`, `*_ns`. Times are ns from the capture's time origin
(the nsys session start), as in the export.

`docs/json.md` documents every field. Within `@1` fields may be added; a rename or removal
means `@2`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

SCHEMA_ID = "nsysan/analysis@1"

# The memory kinds of the events frame, in the order they are shown.
KINDS = ("device", "array", "static", "managed", "managed_static", "pinned", "pageable", "unknown")
# Kinds that occupy memory on the GPU itself: the "device memory" of a process's peak.
# Managed memory lives on the GPU only while migrated there, pinned and pageable memory are
# host memory; they get their own groups and are not added to the device peak.
GPU_RESIDENT_KINDS = ("device", "array", "static")

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Diagnostic:
    """A problem that weakens the numbers without stopping the analysis."""

    severity: str  # error | warning | info
    code: str  # stable identifier, e.g. "no_memory_table"
    message: str  # one or two sentences a user can act on


@dataclass(frozen=True)
class Source:
    """The file the user gave and how it was read."""

    path: str
    name: str
    format: str  # sqlite | nsys-rep | qdrep
    size_bytes: int
    exported_with: Optional[str] = None  # nsys version that exported it for this run, if any
    from_cache: bool = False  # the export came from nsysan's cache


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


@dataclass(frozen=True)
class CallSite:
    """Where an allocation was made.

    With call stacks: the first frame outside the CUDA runtime/driver, the profiler and the
    allocator layers (PyTorch's caching allocator is walked past). Without: the API name, the
    innermost NVTX range and the thread name.
    """

    label: str  # what is shown, e.g. "alloc_weights (known)" or "cudaMalloc in 'step 2' [python3]"
    function: str = ""  # "alloc_weights" (no parameter list); "" without stacks
    symbol: str = ""  # full symbol, e.g. "alloc_weights(unsigned long)"
    module: str = ""  # module file name, e.g. "known"
    from_stack: bool = False


@dataclass(frozen=True)
class Allocation:
    """One allocation (an alloc event and, when seen, its free)."""

    pid: int
    tid: int
    device: int
    kind: str
    api: str
    address: int
    bytes: int
    alloc_time_ns: int
    free_time_ns: Optional[int]  # None: not freed during the capture
    nvtx_range: str  # innermost NVTX range open on the allocating thread, "" if none
    site: CallSite


@dataclass(frozen=True)
class GroupSummary:
    """Totals of one (process, CUDA device, memory kind)."""

    pid: int
    device: int
    kind: str
    gpu: Optional[int]  # GPU id this CUDA device is, when the capture says
    peak_bytes: int
    peak_time_ns: Optional[int]
    end_bytes: int  # live at the end of the capture
    allocations: int
    frees: int
    allocated_bytes: int
    never_freed_bytes: int
    never_freed_count: int
    frees_without_alloc: int  # frees of memory allocated before the capture
    frees_without_alloc_bytes: int


@dataclass(frozen=True)
class Peak:
    """Highest live GPU-resident bytes (device + array + static) and what made it up.

    `pid` None means all processes on that GPU together.
    """

    pid: Optional[int]
    device: int  # CUDA ordinal of the process; for pid None, the GPU id
    gpu: Optional[int]
    peak_bytes: int
    peak_time_ns: int
    nvtx_range: str  # innermost range open when the peak was reached, on the thread that reached it
    api: str  # the call that reached it
    total_memory_bytes: Optional[int]  # the GPU's capacity, when known
    live_count: int  # allocations live at the peak
    live_at_peak: list[Allocation] = field(default_factory=list)  # largest first, capped


@dataclass(frozen=True)
class Site:
    """Allocation totals of one call site and memory kind."""

    site: CallSite
    kind: str
    apis: list[str]
    allocations: int
    allocated_bytes: int
    never_freed_count: int
    never_freed_bytes: int
    max_live_bytes: int  # the most this site held at any one moment


@dataclass(frozen=True)
class ApiCallStat:
    """Calls of one memory API (counted from the CUDA API trace, with or without sizes)."""

    api: str
    family: str  # alloc | free | vmm | pool | info
    calls: int
    failed: int
    total_time_ns: int
    max_time_ns: int


@dataclass(frozen=True)
class FailedCall:
    """A memory API call that returned an error (for example cudaErrorMemoryAllocation)."""

    pid: int
    tid: int
    api: str
    time_ns: int
    return_value: int
    error: str  # e.g. "cudaErrorMemoryAllocation"
    nvtx_range: str
    live_bytes: Optional[int]  # the process's live GPU-resident bytes at that moment, if sizes known


@dataclass(frozen=True)
class RangeStat:
    """Memory activity inside one NVTX range name (all its instances together)."""

    name: str
    instances: int
    total_time_ns: int
    allocations: int
    allocated_bytes: int
    freed_bytes: int
    still_live_bytes: int  # allocated inside and not freed by the end of the capture
    max_live_bytes: int  # highest live GPU-resident bytes of the process while it was open


@dataclass(frozen=True)
class Series:
    """Live bytes of one (process, device, kind) as a step function, downsampled for drawing."""

    pid: int
    device: int
    kind: str
    ts_ns: list[int]
    live_bytes: list[int]


@dataclass(frozen=True)
class Band:
    """An NVTX range instance drawn under the timeline (e.g. each training step)."""

    pid: int
    name: str
    start_ns: int
    end_ns: int


@dataclass(frozen=True)
class Timeline:
    start_ns: int
    end_ns: int
    series: list[Series] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryCap:
    """The most GPU memory a process could get on one device, as far as the capture tells.

    One per (process, device) and source; `Analysis.memory_cap()` picks the tightest.
    """

    pid: int
    device: int  # CUDA ordinal in that process
    gpu: Optional[int]
    cap_bytes: int
    # gpu_total: the GPU's memory (TARGET_INFO_GPU.totalMemory), of which the CUDA context and
    #   kernel images, not in the trace, take a part;
    # xla_preallocation: the block XLA reserved at start, its allocator's limit;
    # allocator_oom: the live bytes at which the framework's allocator gave up (a memory-fraction
    #   cap or the GPU's free memory; the cap itself is not in the trace).
    source: str
    note: str = ""


@dataclass(frozen=True)
class Analysis:
    schema: str
    # "full", or "quick": only the memory-usage table was read (`nsysan analyze --quick`), so
    # sites, api_calls, failed_calls and ranges are empty and no event has a thread or API name
    scope: str
    source: Source
    capture: Capture
    groups: list[GroupSummary]
    peak: Optional[Peak]  # the highest per-process peak (the headline number)
    peaks: list[Peak]  # per process and device, then per GPU across processes (pid None)
    never_freed: list[Allocation]  # largest first; static module memory is not listed here
    never_freed_total: int  # how many there were (the list may be capped)
    sites: list[Site]
    api_calls: list[ApiCallStat]
    failed_calls: list[FailedCall]
    ranges: list[RangeStat]
    timeline: Timeline
    diagnostics: list[Diagnostic]
    # --- verdicts on out of memory, reserved memory and processes (issue 17, sections 2-4) ---
    caps: list[MemoryCap] = field(default_factory=list)
    # The normalized events frame (see nsysan.events), for notebooks; never serialized.
    events: Any = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = _to_plain(self)
        data.pop("events", None)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Analysis":
        schema = data.get("schema")
        if schema != SCHEMA_ID:
            # Imported lazily so the model stays free of I/O concerns.
            from .errors import NsysanError

            raise NsysanError(f"not an nsysan analysis (schema {schema!r}, expected {SCHEMA_ID!r})")
        # Documents written before "scope" existed come from full analyses.
        return _from_plain(cls, {"scope": "full", **data})

    def process_peaks(self, limit: int = 4) -> list[Peak]:
        """Each process's highest peak with allocations live at it, largest first (the headline
        first): the peaks whose live allocations the summaries list."""
        best: dict[int, Peak] = {}
        for peak in self.peaks:
            if peak.pid is not None and peak.live_count and (
                    peak.pid not in best or peak.peak_bytes > best[peak.pid].peak_bytes):
                best[peak.pid] = peak
        return sorted(best.values(), key=lambda p: (-p.peak_bytes, p.pid))[:limit]

    def process_label(self, pid: Optional[int]) -> str:
        """How outputs name a process: "rank 1" when its rank is known, else "process 2147";
        "all processes" for None (a GPU's total across processes)."""
        if pid is None:
            return "all processes"
        for proc in self.capture.processes:
            if proc.pid == pid and proc.label:
                return proc.label
        return f"process {pid}"

    def memory_cap(self, pid: int, device: int) -> Optional[MemoryCap]:
        """The tightest known cap on what `pid` could hold on CUDA device `device`, or None."""
        mine = [c for c in self.caps if c.pid == pid and c.device == device]
        return min(mine, key=lambda c: c.cap_bytes) if mine else None

    def diagnostics_by_severity(self) -> list[Diagnostic]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return sorted(self.diagnostics, key=lambda d: order.get(d.severity, len(order)))


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _from_plain(tp: Any, value: Any) -> Any:
    """Rebuild a dataclass tree from plain JSON data, guided by the type hints."""
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _from_plain(inner[0], value) if len(inner) == 1 else value
    if origin is list:
        (item,) = typing.get_args(tp)
        return [_from_plain(item, v) for v in value]
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.name in value:
                kwargs[f.name] = _from_plain(hints[f.name], value[f.name])
        return tp(**kwargs)
    return value
