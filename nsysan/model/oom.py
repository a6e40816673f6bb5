"""Why a run ran out of memory, and reserved versus used memory (framework allocators,
preallocations, stream-ordered pools)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # made when first used (oom_found.py's docstring); plain.type_hints finds them for documents
    from .oom_found import AllocatorOom, CacheRelease, CutShort, EndedInside, FatalOom, LoggedOom, OomFailure, Probe


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

    @property
    def name(self) -> str:
        """How the outputs name `allocator` ("PyTorch's caching allocator"); not in the JSON."""
        return ALLOCATOR_NAMES.get(self.allocator, self.allocator)


ALLOCATOR_NAMES = {"pytorch_caching": "PyTorch's caching allocator",
                   "pytorch_expandable": "PyTorch's caching allocator (expandable segments)",
                   "xla_preallocation": "XLA's allocator"}


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
