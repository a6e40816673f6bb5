"""What an out-of-memory search found: failed calls, probes, cache releases, allocators that gave
up, processes cut short or ended inside open ranges, errors read from logs (`OutOfMemory`'s
lists). Apart from oom.py so that a run that found none of them does not make these classes:
nsysan.model makes them at the first use of one of their names (issue 31)."""

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
