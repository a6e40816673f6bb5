"""Why a run ran out of memory, and reserved versus used memory (framework allocators,
preallocations, stream-ordered pools)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .memory import Allocation


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
class SizeCount:
    """`count` live blocks of `bytes` each."""

    bytes: int
    count: int


@dataclass(frozen=True)
class EndedInside:
    """A process whose trace ends inside NVTX ranges it never closed, with no failed call and no
    cache release: what the trace can say when an allocator refused a request by itself (a
    memory-fraction cap with nothing cached) and the process died of it, or when the capture was
    simply stopped (see docs/analyses.md)."""

    pid: int
    device: Optional[int]  # the CUDA device holding most of its memory at the end
    gpu: Optional[int]
    open_ranges: list[str]  # NVTX ranges never closed, outermost first; the last is the innermost
    last_event_ns: int  # its last memory event
    process_ended: bool  # its memory events stopped well before the capture did (it ended; else the capture was cut)
    live_bytes: int  # its live GPU-resident bytes at the end (on all its devices)
    reserved_bytes: Optional[int]  # of them, what its caching allocator held (None: no allocator recognized)
    blocks: int  # live device allocations at the end
    block_sizes: list[SizeCount] = field(default_factory=list)  # their sizes, largest first (at most 8 sizes)
    growth_bytes_per_step: Optional[int] = None  # the growth verdict's rate before the end, when it grew
    message: str = ""


@dataclass(frozen=True)
class LoggedOom:
    """An out-of-memory error found in the program's own log (`--log`), joined with the trace.
    Sizes are as the message prints them (PyTorch: two decimals of MiB or GiB)."""

    log: str  # the log's file name
    line: int  # where the message starts, counting from 1
    framework: str  # "pytorch" | "xla"
    wording: str  # which wording: pytorch_2 ("GPU 0 has a total capacity of"), pytorch_1 ("(GPU 0; ... total
    # capacity; ..."), xla_bfc ("Allocator (GPU_0_bfc) ran out of memory"), xla
    pid: Optional[int]  # the process the line names (pid=N), if any
    matched_pid: Optional[int]  # the trace's process it is joined with
    matched_by: str  # "pid" | "only_death" (the only process that died) | "only_process" | "" (none)
    device: Optional[int]  # the CUDA device the message names ("GPU 0": the process's ordinal)
    request_bytes: Optional[int]  # "Tried to allocate"
    cap_bytes: Optional[int]  # "N allowed" (set_per_process_memory_fraction), XLA's allocator limit
    total_bytes: Optional[int]  # the GPU's capacity
    free_bytes: Optional[int]  # free on the GPU then
    process_bytes: Optional[int]  # this process's use, non-PyTorch memory included
    allocated_bytes: Optional[int]  # held by tensors ("allocated by PyTorch", XLA's InUse)
    reserved_unallocated_bytes: Optional[int]  # cached by the allocator, in no tensor
    others_bytes: Optional[int]  # held on the GPU by other processes: total - free - this process
    verdict: str  # over_cap | fragmentation | other_process | gpu_full | unknown
    trace_reserved_bytes: Optional[int]  # what the trace shows the process's allocator holding then
    message: str


@dataclass(frozen=True)
class FatalOom:
    """A process that died of an out-of-memory error its trace shows no failed call for."""

    pid: Optional[int]  # None: a logged error no process of the trace could be matched to
    found_by: str  # "trace" (its allocator gave up: allocator_ooms), "log" (--log), "trace and log"


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
    ended_inside: list[EndedInside] = field(default_factory=list)  # cut short inside open ranges, no other sign
    logged: list[LoggedOom] = field(default_factory=list)  # errors read from --log files
    # processes that died of out-of-memory with no failed call (`check --no-failed-allocations`
    # fails on these as on failures): from the trace, the log, or both
    fatal: list[FatalOom] = field(default_factory=list)


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
