"""What held memory: allocations, call sites and their stacks, per-group totals, peaks,
API calls, NVTX ranges, and the downsampled timeline drawn from them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

_NUMBERS = re.compile(r"\d+")


def range_family(name: str) -> str:
    """The family of an NVTX range: its numbers as N ("step 3" and "step 4" are "step N"), so that
    what every step keeps is one row, not one per step."""
    return _NUMBERS.sub("N", name)


def site_in_family(label: str, nvtx_range: str) -> str:
    """A site's label with its NVTX range (a site without a stack names it: "cudaMalloc in step 3
    [python]") written as the range's family; a site from a stack is unchanged."""
    return label.replace(nvtx_range, range_family(nvtx_range)) if nvtx_range else label


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
    # How many (site, NVTX range) pairs the row joins: ranges that differ only in their numbers
    # ("step 3", "step 4") are one family, shown as "step N" (in the site too) when it joins several.
    members: int = 1

    def holds(self, allocation: "Allocation") -> bool:
        """Whether `allocation` is one of this group's (the page lists them under their row)."""
        if (allocation.pid, allocation.device, allocation.kind) != (self.pid, self.device, self.kind):
            return False
        if self.members == 1:
            return (allocation.site.label, allocation.nvtx_range) == (self.site.label, self.nvtx_range)
        return (range_family(allocation.nvtx_range) == self.nvtx_range
                and site_in_family(allocation.site.label, allocation.nvtx_range) == self.site.label)


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
class StackBytes:
    """Allocations of one process, device and kind made from one call stack (or, without a stack,
    at one call site), summed: a leaf of the page's flame graph of what was live."""

    pid: int
    device: int
    kind: str
    site: str  # the call site's label, as in `CallSite.label`
    stack_id: Optional[int]  # the allocations' own call stack (Analysis.stacks), None without one
    bytes: int
    count: int
    first_alloc_ns: Optional[int] = None  # when the oldest of them was allocated (None in older documents)


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
    # Every allocation live at the peak by call stack, largest first (capped): what the flame graph draws
    live_stacks: list[StackBytes] = field(default_factory=list)

    @property
    def gpu_or_device(self) -> int:
        """The GPU it was reached on: its id, or the CUDA ordinal when the capture does not say."""
        return self.device if self.gpu is None else self.gpu


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


# An analysis lists at most this many failed calls, the first ones (docs/json.md's failed_calls).
MAX_FAILED_CALLS = 1000


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
    # Allocated inside it or inside a range nested in it (a step's phases): a step whose phases
    # allocate everything has allocated_bytes 0 and this the step's bytes. Equal to the innermost
    # counts for an operator range and for a range with nothing nested; 0 in older documents
    nested_allocations: int = 0
    nested_allocated_bytes: int = 0


@dataclass(frozen=True)
class RangeFamily:
    """User NVTX ranges whose names differ only in their numbers ("step 0" ... "step 9"), summed over
    every name of the family (before `Analysis.ranges` is capped): what the page shows as one row."""

    name: str  # the family, numbers as N: "step N"
    first: str  # its names that opened first and last: "step 0", "step 9"
    last: str
    names: int  # distinct names in it
    instances: int
    total_time_ns: int
    allocations: int
    allocated_bytes: int  # innermost, as RangeStat.allocated_bytes
    freed_bytes: int
    still_live_bytes: int
    max_live_bytes: int  # the highest of its names'
    nested_allocations: int  # RangeStat.nested_*, summed: nested ranges included
    nested_allocated_bytes: int
    first_start_ns: int

    @property
    def label(self) -> str:
        """How a table names it: by its first and last names ("step 0 – step 4"), or, when they are
        long (XLA's pass names), once as the family."""
        return f"{self.first} – {self.last}" if len(self.first) <= 30 else self.name


@dataclass(frozen=True)
class Holder:
    """Memory allocated inside steps and still live at the end of the capture: one call site in
    one innermost NVTX range."""

    site: str  # call-site label, as in `Site.site.label`
    nvtx_range: str  # innermost NVTX range of the allocations, "" if none
    bytes: int
    allocations: int


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
    # PyTorch's operator ranges (--pytorch=autograd-nvtx) of the processes, every thread, at their
    # depth among operators (1 = outermost operator): the page's deepest tracks (capped, the longest)
    operator_spans: list[NvtxSpan] = field(default_factory=list)
