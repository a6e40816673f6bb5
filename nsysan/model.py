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

from .smi_model import SmiOverlay

SCHEMA_ID = "nsysan/analysis@1"

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
class Frame:
    """One frame of a call stack: a Python function at a file and line, or a native symbol in a module."""

    function: str  # "main", "alloc_weights", "at::native::empty_cuda" (no parameter list)
    file: str = ""  # Python source file as recorded, e.g. "/home/user/train.py"; "" for native frames
    line: Optional[int] = None  # Python line number; None for native frames
    module: str = ""  # native module file name, e.g. "libtorch_cuda.so"; "" for Python frames


@dataclass(frozen=True)
class Stack:
    """A whole call stack, innermost frame first; sites and allocations refer to it by `id`."""

    id: int
    source: str  # python (--python-backtrace=cuda) | native (--cudabacktrace)
    frames: list[Frame] = field(default_factory=list)


@dataclass(frozen=True)
class CallSite:
    """Where an allocation was made (see docs/analyses.md, "Sites").

    Best first: the innermost frame of the user's own code in a Python stack; the first native
    frame outside the CUDA libraries, allocator, framework, interpreter and libc; the innermost
    PyTorch operator range; the operator a framework-only native stack serves; else the API
    name, the innermost NVTX range and the thread name.
    """

    label: str  # what is shown, e.g. "main (torch_train.py:43)" or "cudaMalloc in 'step 2' [python3]"
    function: str = ""  # "alloc_weights" (no parameter list); "" without stacks
    symbol: str = ""  # full symbol, e.g. "alloc_weights(unsigned long)"
    module: str = ""  # module file name, e.g. "known"
    from_stack: bool = False
    # python | native | operator | api: which source named the site
    source: str = "api"
    file: str = ""  # Python site: its source file as recorded
    line: Optional[int] = None  # Python site: its line
    context: str = ""  # one line under the label, e.g. the framework frame the user's line called
    stack_id: Optional[int] = None  # a stack of the site (Analysis.stacks), None without one


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
    stack_id: Optional[int] = None  # this allocation's own call stack (Analysis.stacks), if recorded
    operator: str = ""  # innermost PyTorch operator range open at the call, e.g. "aten::empty"


@dataclass(frozen=True)
class AllocationGroup:
    """Allocations of one process, device, kind, call site and innermost NVTX range, summed: the
    row shown instead of a hundred near-identical ones (a step that leaks the same block each time)."""

    pid: int
    device: int
    kind: str
    site: CallSite
    nvtx_range: str
    count: int
    total_bytes: int
    min_bytes: int
    max_bytes: int
    first_alloc_ns: int  # when the first of them was allocated
    last_alloc_ns: int  # when the last of them was allocated


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
    # Unused reserve of stream-ordered pools counted in peak_bytes (a pool holds what it reserved)
    pool_reserve_bytes: int = 0
    # What made the peak when `api` alone would mislead: a module load adding a few statics on top
    # of a level reached earlier, or a framework's preallocation
    note: str = ""
    made_of: list["Holder"] = field(default_factory=list)  # live at the peak by site and range, largest first, capped
    # Every allocation live at the peak, grouped by site and NVTX range, largest total first (capped)
    live_groups: list[AllocationGroup] = field(default_factory=list)


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
    pid: Optional[int] = None  # the process (sites are per process: ranks are not summed)


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
    operator: bool = False  # a PyTorch operator (aten::...), all its instances; else the user's range
    first_start_ns: Optional[int] = None  # when its first instance opened (ranges in time order)
    # Memory allocation calls made inside it (innermost), counted from the API trace when sizes
    # were not collected; None when sizes are known (then `allocations` says it)
    alloc_calls: Optional[int] = None


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
class NvtxSpan:
    """One NVTX push/pop range instance on a process's main thread, at its nesting depth (1 =
    outermost): what the page shows as the NVTX path under the cursor."""

    pid: int
    tid: int
    name: str
    start_ns: int
    end_ns: int
    depth: int


@dataclass(frozen=True)
class TraceEnd:
    """Where a process's CUDA trace stops while the process visibly goes on (NVTX ranges after it):
    nothing after `time_ns` is in the numbers."""

    pid: int
    time_ns: int  # the process's last CUDA call in the trace


@dataclass(frozen=True)
class Timeline:
    start_ns: int
    end_ns: int
    series: list[Series] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    # Where memory moves (the steps, without the flat setup before them): the span a page opens on
    focus_start_ns: Optional[int] = None
    focus_end_ns: Optional[int] = None
    spans: list[NvtxSpan] = field(default_factory=list)  # main-thread NVTX ranges, all depths (capped)
    # The largest allocations with their lifetimes (capped, largest first): what was live when
    allocations: list[Allocation] = field(default_factory=list)
    allocations_total: int = 0  # how many allocations there were in all
    trace_ends: list[TraceEnd] = field(default_factory=list)


# Field metadata of the frames read from the export: kept on the object, never serialized.
RAW = {"raw": True}


class Tables:
    """`frame(name)` and `frame_names()` for a result model other than `Analysis` (a
    `Comparison`, a check `Verdict`): each list in it as a pandas DataFrame (see nsysan.frames).

    >>> import nsysan
    >>> comparison = nsysan.compare("fixtures/torch_clean_v25.sqlite", "fixtures/torch_leak_v25.sqlite")
    >>> comparison.frame_names()
    ['processes', 'sites', 'ranges']
    >>> int(comparison.frame("processes")["peak_delta"].iloc[0])
    3800039424
    """

    def frame(self, name: str) -> Any:
        from .frames import table_frame

        return table_frame(self, name)

    @classmethod
    def frame_names(cls) -> list[str]:
        from .frames import table_names

        return table_names(cls)


@dataclass(frozen=True)
class OomFailure:
    """A memory call that failed with out-of-memory, and what held its GPU at that moment."""

    pid: int
    tid: int
    api: str
    time_ns: int
    return_value: int
    error: str  # cudaErrorMemoryAllocation / CUDA_ERROR_OUT_OF_MEMORY
    call_number: int  # this is the process's n-th call of `api` (1 = first)
    nvtx_path: str  # NVTX ranges open on the calling thread, outermost first, " > "-joined
    device: Optional[int]  # CUDA ordinal the call most likely targeted (see docs/analyses.md)
    gpu: Optional[int]
    process_live_bytes: Optional[int]  # the process's live GPU-resident bytes then; None without sizes
    gpu_live_bytes: Optional[int]  # every process's live GPU-resident bytes on that GPU then
    total_memory_bytes: Optional[int]  # the GPU's memory
    headroom_bytes: Optional[int]  # total - gpu_live: an upper bound, the context and kernel images are not in the trace
    live_count: int  # allocations live on that GPU then
    live_at_failure: list[Allocation] = field(default_factory=list)  # the largest of them, at most 20
    retried_after_ns: Optional[int] = None  # a later successful call of the same API on the thread, this long after


@dataclass(frozen=True)
class Probe:
    """A failed call that is not a failure: an API probing for a feature and retrying at once."""

    pid: int
    tid: int
    api: str
    time_ns: int
    return_value: int
    error: str  # e.g. CUDA_ERROR_NOT_PERMITTED
    nvtx_path: str
    retried_after_ns: int  # the same API succeeded on that thread this long after


@dataclass(frozen=True)
class CacheRelease:
    """A burst of frees by a caching allocator: cached blocks given back to the driver at once."""

    pid: int
    device: int
    gpu: Optional[int]
    start_ns: int  # first free of the burst
    end_ns: int  # last free of the burst
    blocks: int
    released_bytes: int
    nvtx_path: str  # ranges open on the freeing thread at the first free
    live_before_bytes: int  # the process's live GPU-resident bytes on that device just before
    live_after_bytes: int  # ... and just after
    followed_by_allocation: bool  # the process allocated on that device afterwards (a flush, not an OOM)


@dataclass(frozen=True)
class AllocatorOom:
    """A framework allocator that gave up without a failing CUDA call (torch.OutOfMemoryError)."""

    release: CacheRelease  # the allocator's last attempt: it freed its cache, then nothing more
    open_ranges: list[str]  # NVTX ranges of the process still open at the end of the capture
    live_count: int  # allocations live at the start of the release
    live_at_release: list[Allocation] = field(default_factory=list)  # the largest of them, at most 20


@dataclass(frozen=True)
class CutShort:
    """A process whose capture ends while it was still working."""

    pid: int
    last_event_ns: int  # its last memory event
    open_ranges: list[str]  # NVTX ranges never closed (outermost first)
    climbing: bool  # live bytes rose over the last part of its events
    end_live_bytes: int  # its live GPU-resident bytes at the end


@dataclass(frozen=True)
class OutOfMemory:
    """Why a run ran out of memory, and the events that look like it."""

    failures: list[OomFailure] = field(default_factory=list)  # out-of-memory calls, first 20
    failed_count: int = 0  # how many calls failed with out-of-memory (the list may be capped)
    probes: list[Probe] = field(default_factory=list)
    allocator_ooms: list[AllocatorOom] = field(default_factory=list)
    # bursts followed by more allocations: empty_cache() or an allocator retry that succeeded
    # (what PyTorch counts as num_alloc_retries, plus empty_cache calls)
    cache_flushes: list[CacheRelease] = field(default_factory=list)
    cut_short: list[CutShort] = field(default_factory=list)


@dataclass(frozen=True)
class AllocatorUse:
    """What a framework's allocator holds on one device: reserved (what the trace shows) and the
    rest (library workspaces and other direct allocations)."""

    pid: int
    device: int
    gpu: Optional[int]
    # pytorch_caching: PyTorch's caching allocator (segments of 2 MiB, 20 MiB, 2 MiB multiples);
    # pytorch_expandable: the same with expandable_segments (VMM maps of 2 MiB / 20 MiB);
    # xla_preallocation: XLA's allocator, which reserved one block at start
    allocator: str
    inside_at_peak_bytes: int  # live bytes the allocator held (reserved) at the process's peak
    outside_at_peak_bytes: int  # live device bytes not from it at the peak
    inside_end_bytes: int  # ... at the end of the capture
    outside_end_bytes: int
    outside_allocations: int  # allocations counted outside (library workspaces, ...)
    message: str  # the plain-words verdict


@dataclass(frozen=True)
class Preallocation:
    """One block reserved at start for a framework's own allocator (XLA/JAX by default)."""

    pid: int
    device: int
    gpu: Optional[int]
    bytes: int
    time_ns: int
    api: str
    share_of_gpu: Optional[float]  # bytes / the GPU's memory
    framework: str  # "XLA" when XLA's NVTX ranges are in the capture, else ""
    message: str


@dataclass(frozen=True)
class PoolUse:
    """A stream-ordered memory pool (cudaMallocAsync): what it reserved over time next to what it
    handed out (CUDA_GPU_MEMORY_USAGE_EVENTS pool columns and CUDA_GPU_MEMORY_POOL_EVENTS)."""

    pid: int
    device: int
    gpu: Optional[int]
    address: int  # the pool's base address
    pool_type: str  # local | imported | ""
    created_ns: Optional[int]
    peak_reserved_bytes: int  # localMemoryPoolSize at its highest
    peak_used_bytes: int  # bytes handed out and not yet freed, at their highest
    end_reserved_bytes: int
    trims: int  # trim events (cudaMemPoolTrimTo, or the release threshold at a synchronize)
    destroyed_ns: Optional[int]
    ts_ns: list[int] = field(default_factory=list)  # step series, downsampled: time
    reserved_bytes: list[int] = field(default_factory=list)  # the pool's reserve after that moment
    used_bytes: list[int] = field(default_factory=list)  # handed out after that moment


@dataclass(frozen=True)
class ReservedMemory:
    """Reserved versus used: framework allocators, preallocations and memory pools."""

    allocators: list[AllocatorUse] = field(default_factory=list)
    preallocations: list[Preallocation] = field(default_factory=list)
    pools: list[PoolUse] = field(default_factory=list)


# --- Steps and growth (docs/analyses.md, "Steps and the growth verdict") -----------------------

@dataclass(frozen=True)
class Holder:
    """Memory allocated inside steps and still live at the end of the capture: one call site in
    one innermost NVTX range."""

    site: str  # call-site label, as in `Site.site.label`
    nvtx_range: str  # innermost NVTX range of the allocations, "" if none
    bytes: int
    allocations: int


@dataclass(frozen=True)
class Step:
    """One step of one process on one device. Live bytes are the process's device + array bytes
    on that device (module statics, loaded by the driver, are left out)."""

    number: int  # the number in the range's name ("step 3" -> 3) when every step has its own, else 0, 1, ...
    name: str  # the NVTX range, e.g. "step 3"
    start_ns: int
    end_ns: int  # the range's end, or the capture's end when it never closed
    closed: bool  # the range closed within the capture
    start_live_bytes: int  # live just before the step started
    end_live_bytes: int  # live when it ended
    delta_bytes: int  # end_live_bytes minus the previous step's; the first step: minus its own start
    peak_live_bytes: int  # the most live at any moment inside it
    allocated_bytes: int  # allocated inside it
    freed_bytes: int  # freed inside it (whenever allocated)
    kept_bytes: int  # allocated inside it and still live at the end of the capture
    kept: list[Holder] = field(default_factory=list)  # who holds kept_bytes, largest first, capped
    traced: bool = True  # False: the process's CUDA trace stopped before the step ended (not judged)


@dataclass(frozen=True)
class StepSeries:
    """The steps of one (process, CUDA device)."""

    pid: int
    device: int
    gpu: Optional[int]
    range_name: str  # the steps' name with numbers as N, e.g. "step N"; the pattern with --step-range
    found_by: str  # "nvtx": repeated NVTX ranges; "step-range": the --step-range pattern
    steps: list[Step] = field(default_factory=list)  # in time order; the first and last when there are many
    step_count: Optional[int] = None  # steps found (the verdict judges them all); None: all are listed


@dataclass(frozen=True)
class Growth:
    """The growth verdict of one (process, CUDA device), from its steps."""

    pid: int
    device: int
    gpu: Optional[int]
    process: str  # how outputs name the process: "rank 1", or "process 2147"
    verdict: str  # growing | uneven | stable | too_few_steps | preallocated
    first_step: Optional[int]  # number of the first step judged (after the warm-up)
    last_step: Optional[int]  # number of the last step judged
    bytes_per_step: int  # median delta_bytes of the judged steps
    total_bytes: int  # live at the end of the last judged step minus before the first
    threshold_bytes: int  # a step "grows" when its delta is above this: max(1 MiB, 1% of live)
    growing_steps: list[int]  # numbers of the judged steps whose delta is above the threshold
    end_live_bytes: int  # live at the end of the last judged step
    capacity_bytes: Optional[int]  # what the projection runs into: the tightest MemoryCap, when known
    capacity_step: Optional[int]  # the step at which, at bytes_per_step, capacity_bytes is reached
    holders: list[Holder]  # where the memory allocated in judged steps and never freed sits
    message: str  # the verdict in one sentence, as shown
    capacity_source: str = ""  # MemoryCap.source of capacity_bytes (gpu_total, xla_preallocation, ...)


@dataclass(frozen=True)
class Phase:
    """What one NVTX range path costs on one (process, device): live device + array bytes at the
    start of each instance, the rise of the peak inside above that start, and the net change at
    its end. Per-instance lists are in time order, at most 200; the statistics use every instance."""

    pid: int
    device: int
    gpu: Optional[int]
    path: str  # range names outermost first, numbers as N: "step N > backward"
    instances: int
    start_live_median_bytes: int
    rise_median_bytes: int
    rise_max_bytes: int
    net_median_bytes: int
    net_min_bytes: int
    net_max_bytes: int
    start_ns: list[int] = field(default_factory=list)  # each instance's start
    start_live_bytes: list[int] = field(default_factory=list)
    rise_bytes: list[int] = field(default_factory=list)
    net_bytes: list[int] = field(default_factory=list)
    step: list[int] = field(default_factory=list)  # number of the step it ran in, -1 outside the steps


@dataclass(frozen=True)
class Spike:
    """A sudden rise of a (process, device)'s live device + array bytes."""

    pid: int
    device: int
    gpu: Optional[int]
    found_by: str  # "window": within the spike window; "range": within one innermost NVTX range instance
    start_ns: int  # the first event of the rise
    peak_ns: int  # when it peaked
    rise_bytes: int
    start_live_bytes: int  # live just before the rise
    peak_live_bytes: int
    nvtx_path: str  # NVTX ranges open on the thread whose call made the peak, outermost first
    apis: list[str] = field(default_factory=list)  # the calls that made it, by bytes, at most 3
    sites: list[Holder] = field(default_factory=list)  # where they were made, by bytes, at most 3
    freed_after_bytes: int = 0  # how much of the rise was freed again before the capture ended
    given_back_ns: Optional[int] = None  # when live bytes fell back to start_live_bytes; None: never in the capture


@dataclass(frozen=True)
class Answer:
    """One line of the answers shown first: the peak, growth, out-of-memory, and every warning
    that says the numbers cannot be fully trusted (the same warnings are in `diagnostics`)."""

    topic: str  # peak | growth | oom | reserved | trust
    severity: str  # error | warning | info
    code: str  # the diagnostic's code, or "peak" / "growth_<verdict>"
    message: str


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
    """Everything nsysan found in one report: what `nsysan.analyze()` returns.

    Each list is a table; `frame(name)` gives it as a pandas DataFrame whose columns are the
    JSON field names (units in the names: `*_bytes`, `*_ns` from the capture's start), and
    `frame_names()` lists them. The frames read from the export are kept too: `events`
    (every allocation and free), `calls` (every memory API call) and `nvtx_ranges` (every NVTX
    push/pop range); they are not in the JSON, so an Analysis read by `load_analysis()` has None.

    >>> import nsysan
    >>> analysis = nsysan.analyze("fixtures/known_mem_v25.sqlite")
    >>> analysis.peak.peak_bytes, analysis.peak.nvtx_range
    (952107008, 'burst')
    >>> sites = analysis.frame("sites")
    >>> sites.sort_values("allocated_bytes", ascending=False)["site_label"].iloc[0]
    'cudaMalloc in burst [known]'
    >>> len(analysis.events), len(analysis.calls)
    (52, 53)

    In Jupyter, the last expression of a cell shows the report page; `repr()` is one line.
    """

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
    oom: OutOfMemory = field(default_factory=OutOfMemory)
    reserved: ReservedMemory = field(default_factory=ReservedMemory)
    # Call stacks referred to by sites and allocations (stack_id), each stored once
    stacks: list[Stack] = field(default_factory=list)
    steps: list[StepSeries] = field(default_factory=list)  # per process and device; [] without steps
    growth: list[Growth] = field(default_factory=list)  # one verdict per StepSeries
    answers: list[Answer] = field(default_factory=list)  # shown first, in this order
    # Every never-freed allocation grouped by site and NVTX range, largest total first (capped)
    never_freed_groups: list[AllocationGroup] = field(default_factory=list)
    phases: list[Phase] = field(default_factory=list)  # per range path, the largest rises first
    spikes: list[Spike] = field(default_factory=list)  # per process and device, the largest first
    # The frames read from the export (pandas DataFrames), for notebooks; never serialized.
    events: Any = field(default=None, compare=False, repr=False, metadata=RAW)  # see nsysan.events
    calls: Any = field(default=None, compare=False, repr=False, metadata=RAW)  # memory API calls
    nvtx_ranges: Any = field(default=None, compare=False, repr=False, metadata=RAW)  # NVTX ranges
    # nvidia-smi logs against the trace (`analyze --smi`); absent from the JSON without them
    smi: Optional[SmiOverlay] = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (`nsysan/analysis@1`) as plain dicts and lists; the raw frames are left out.

        >>> import nsysan
        >>> doc = nsysan.analyze("fixtures/known_mem_v25.sqlite").to_dict()
        >>> doc["schema"], doc["peak"]["peak_bytes"], "events" in doc
        ('nsysan/analysis@1', 952107008, False)
        """
        data = {f.name: _to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.metadata.get("raw")}
        if data.get("smi") is None:
            data.pop("smi", None)  # only analyses given nvidia-smi logs have the section
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Analysis":
        """Rebuild an Analysis from its JSON document; raises NsysanError naming the first field
        that is missing or of the wrong type. Fields added within @1 after a document was written
        read as their default (an empty list, None), so older documents load.

        >>> import nsysan
        >>> analysis = nsysan.analyze("fixtures/known_mem_v25.sqlite")
        >>> Analysis.from_dict(analysis.to_dict()) == analysis
        True
        >>> Analysis.from_dict({"schema": "nsysan/analysis@1"})
        Traceback (most recent call last):
        nsysan.errors.NsysanError: field 'source' is missing
        """
        # Imported lazily so the model stays free of I/O concerns.
        from .errors import NsysanError

        schema = data.get("schema") if isinstance(data, dict) else None
        if schema != SCHEMA_ID:
            raise NsysanError(f"not an nsysan analysis (schema {schema!r}, expected {SCHEMA_ID!r})")
        try:
            # Documents written before "scope" existed come from full analyses.
            return _from_plain(cls, {"scope": "full", **data}, "")
        except _Malformed as err:
            raise NsysanError(str(err)) from None

    def frame(self, name: str) -> Any:
        """The table `name` as a new pandas DataFrame, or one of the raw frames (`events`,
        `calls`, `nvtx_ranges`) itself. Columns and units: docs/python.md.

        >>> import nsysan
        >>> analysis = nsysan.analyze("fixtures/known_mem_v25.sqlite")
        >>> leaks = analysis.frame("never_freed")
        >>> leaks.loc[leaks["bytes"] >= 4 << 20, "nvtx_range"].tolist()
        ['setup', 'other kinds', 'step 2', 'step 5', 'step 8']
        >>> analysis.frame("events").groupby("op", observed=True)["bytes"].sum().to_dict()
        {'alloc': 1365221376, 'free': 1212153856}
        """
        from .errors import NsysanError
        from .frames import RAW_FRAMES, table_frame

        if name in RAW_FRAMES:
            raw = getattr(self, name)
            if raw is None:
                raise NsysanError(f"the {name} frame is read from the export and is not in an analysis "
                                  "JSON; analyze the report itself to have it")
            return raw
        return table_frame(self, name)

    @classmethod
    def frame_names(cls) -> list[str]:
        """The names `frame()` takes for the result tables (the raw frames come on top).

        >>> {"sites", "never_freed", "live_at_peak", "timeline"} <= set(Analysis.frame_names())
        True
        """
        from .frames import table_names

        return table_names(cls)

    def __repr__(self) -> str:
        """One short line: the file, the headline peak and the counts (the tables: `frame()`).

        >>> import nsysan
        >>> nsysan.analyze("fixtures/known_mem_v25.sqlite")     # doctest: +NORMALIZE_WHITESPACE
        <nsysan.Analysis of known_mem_v25.sqlite: peak 908.0 MiB (process 1313, device 0, at 517.08 ms
        in 'burst'); never freed 6 (146.0 MiB); failed calls 0; diagnostics: 1 warning, 1 info>
        """
        from .units import fmt_bytes, fmt_time

        name = self.source.name if len(self.source.name) <= 80 else self.source.name[:77] + "..."
        parts = [f"<nsysan.Analysis of {name}" + (" (quick)" if self.scope == "quick" else "") + ":"]
        if self.peak is None:
            parts.append(" no memory events;")
        else:
            where = f"process {self.peak.pid}, device {self.peak.device}, at {fmt_time(self.peak.peak_time_ns)}"
            in_range = f" in {self.peak.nvtx_range[:40]!r}" if self.peak.nvtx_range else ""
            parts.append(f" peak {fmt_bytes(self.peak.peak_bytes)} ({where}{in_range});")
        leaked = sum(a.bytes for a in self.never_freed) if self.never_freed_total == len(self.never_freed) else None
        parts.append(f" never freed {self.never_freed_total}" + (f" ({fmt_bytes(leaked)})" if leaked else "") + ";")
        parts.append(f" failed calls {len(self.failed_calls)};")
        if self.oom.failed_count or self.oom.allocator_ooms:
            parts.append(f" out of memory: {self.oom.failed_count} failed, "
                         f"{len(self.oom.allocator_ooms)} allocator gave up;")
        counts = {s: sum(d.severity == s for d in self.diagnostics) for s in SEVERITIES}
        parts.append(" diagnostics: " + (", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none") + ">")
        return "".join(parts)

    def _repr_html_(self) -> str:
        """The report page (as `nsysan analyze -o` writes it) in a sandboxed frame sized for a
        notebook cell: self-contained, nothing is fetched from the network."""
        from .render.notebook import report_frame

        return report_frame(self)

    def process_peaks(self, limit: int = 4) -> list[Peak]:
        """Each process's highest peak with allocations live at it, largest first (the headline
        first): the peaks whose live allocations the summaries list.

        >>> import nsysan
        >>> ddp = nsysan.analyze("fixtures/ddp_leak_v25.sqlite")     # two ranks, two GPUs
        >>> [(p.pid, p.gpu) for p in ddp.process_peaks()]
        [(2147, 1), (2146, 0)]
        """
        best: dict[int, Peak] = {}
        for peak in self.peaks:
            if peak.pid is not None and peak.live_count and (
                    peak.pid not in best or peak.peak_bytes > best[peak.pid].peak_bytes):
                best[peak.pid] = peak
        return sorted(best.values(), key=lambda p: (-p.peak_bytes, p.pid))[:limit]

    def process_label(self, pid: Optional[int]) -> str:
        """How outputs name a process: "rank 1" when its rank is known, else "process 2147";
        "all processes" for None (a GPU's total across processes).

        >>> import nsysan
        >>> ddp = nsysan.analyze("fixtures/ddp_leak_v25.sqlite")
        >>> ddp.process_label(2147), ddp.process_label(None)
        ('rank 1', 'all processes')
        """
        if pid is None:
            return "all processes"
        for proc in self.capture.processes:
            if proc.pid == pid and proc.label:
                return proc.label
        return f"process {pid}"

    def memory_cap(self, pid: int, device: int) -> Optional[MemoryCap]:
        """The tightest known cap on what `pid` could hold on CUDA device `device`, or None.

        >>> import nsysan
        >>> cap = nsysan.analyze("fixtures/known_mem_v25.sqlite").memory_cap(1313, 0)
        >>> cap.cap_bytes, cap.source                                 # the H200's memory
        (150109880320, 'gpu_total')
        """
        mine = [c for c in self.caps if c.pid == pid and c.device == device]
        return min(mine, key=lambda c: c.cap_bytes) if mine else None

    def diagnostics_by_severity(self) -> list[Diagnostic]:
        """The diagnostics, errors first, then warnings, then info.

        >>> import nsysan
        >>> [d.code for d in nsysan.analyze("fixtures/known_mem_v25.sqlite").diagnostics_by_severity()]
        ['memory_kept_unevenly', 'no_backtraces']
        """
        order = {s: i for i, s in enumerate(SEVERITIES)}
        return sorted(self.diagnostics, key=lambda d: order.get(d.severity, len(order)))


def _to_plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


class _Malformed(ValueError):
    """A document field that is missing or of the wrong type (the message names it)."""


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
               list: "a list", dict: "an object"}


def _from_plain(tp: Any, value: Any, path: str = "") -> Any:
    """Rebuild a dataclass tree from plain JSON data, guided by the type hints; `path` names the
    field being read (e.g. "peaks[0].live_at_peak[2].bytes") for the error."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return _from_plain(inner[0], value, path) if len(inner) == 1 else value
    if tp is Any:
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        _expect(value, list, path)
        return [_from_plain(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        _expect(value, dict, path)
        hints = typing.get_type_hints(tp)
        kwargs = {}
        for f in dataclasses.fields(tp):
            if f.metadata.get("raw"):
                continue
            where = f"{path}.{f.name}" if path else f.name
            if f.name in value:
                kwargs[f.name] = _from_plain(hints[f.name], value[f.name], where)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                kwargs[f.name] = _added_later(hints[f.name], where)
        return tp(**kwargs)
    if tp in _TYPE_NAMES:
        _expect(value, tp, path)
    return value


def _expect(value: Any, tp: type, path: str) -> None:
    # JSON has one kind of number: an integral float is not an integer, a bool is neither.
    ok = isinstance(value, tp) and not (isinstance(value, bool) and tp is not bool)
    if tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise _Malformed(f"field {path!r} should be {_TYPE_NAMES[tp]}, not {shown}")


def _added_later(hint: Any, path: str) -> Any:
    """The value of a field the document lacks: a list or an optional field may have been added
    to @1 after the document was written (empty / None then); anything else is missing."""
    if typing.get_origin(hint) is list:
        return []
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint):
        return None
    raise _Malformed(f"field {path!r} is missing")
