"""GPU memory no memory event shows: CUDA code loads and contexts (`Analysis.hidden`) and the
memory captured into CUDA graphs (`Analysis.graphs`). Same conventions as the rest of the
model: frozen dataclasses, sizes in bytes, times in ns from the capture's start, None for
"not known"; docs/json.md documents every field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class StepLoads:
    """Code loads of one step (or request) of one process."""

    name: str  # the step's NVTX range, e.g. "step 3"
    start_ns: int
    end_ns: int
    loads: int  # cuModuleLoad* / cuLibraryLoad* calls inside it
    unloads: int  # cuModuleUnload / cuLibraryUnload calls inside it
    static_bytes: int  # module statics (static memory) loaded inside it
    smi_gap_bytes: Optional[int] = None  # nvidia-smi minus the traced live bytes at its end (--smi)


@dataclass(frozen=True)
class LibraryMemory:
    """Device memory a CUDA library (cuBLAS, cuDNN, NCCL, ...) allocated itself, named from the
    call stacks of its allocation sites."""

    library: str  # "cuBLAS", "cuDNN", "NCCL", ...
    allocations: int
    allocated_bytes: int
    max_live_bytes: int  # the sum of its sites' most live at once (an upper bound)
    never_freed_bytes: int


@dataclass(frozen=True)
class ProcessContext:
    """A CUDA context of one process (TARGET_INFO_CUDA_CONTEXT_INFO; green contexts left out)."""

    device: int  # CUDA device
    gpu: Optional[int]  # capture GPU id, when known
    # it allocated device, array or managed memory there; False: the context alone costs memory; None:
    # sizes were not collected, so it cannot be told
    allocates: Optional[bool]


@dataclass(frozen=True)
class ProcessCode:
    """What one process loaded onto its GPUs besides its allocations."""

    pid: int
    process: str  # "rank 1" or "process 2147"
    context_ns: Optional[int] = None  # its first cuInit / context creation call; None when the trace has none
    contexts: list[ProcessContext] = field(default_factory=list)  # per device; [] before nsys 2023
    loads: int = 0  # cuModuleLoad* + cuLibraryLoad* calls
    unloads: int = 0
    apis: dict[str, int] = field(default_factory=dict)  # calls per API name
    loads_before_steps: int = 0  # before the first step (start-up); all of them without steps
    loads_in_steps: int = 0
    loads_after_steps: int = 0
    steps_with_loads: int = 0  # steps (of those listed) in which code was loaded
    steps: list[StepLoads] = field(default_factory=list)  # the process's listed steps, in time order
    keeps_loading: bool = False  # code loaded in more than half of the steps after the first
    # When it keeps loading: its loads in steps (all of them without steps) by the short name of the
    # kernel of the process that ran first after each, within 1 s (the code a load from memory
    # brought: it names no file), at most 5, and by the library those names tell (cuDNN, cuBLAS,
    # NCCL, Triton, cuFFT, or "own"); most loads first; {} otherwise and without a kernel table
    kernels_after_loads: dict[str, int] = field(default_factory=dict)
    libraries_after_loads: dict[str, int] = field(default_factory=dict)
    static_bytes: int = 0  # module statics live at the end (static memory kind)
    libraries: list[LibraryMemory] = field(default_factory=list)  # largest first; [] without stacks
    outside_allocator_bytes: Optional[int] = None  # live device bytes outside a framework allocator at its peak
    smi_gap_bytes: Optional[int] = None  # median nvidia-smi minus traced live bytes (--smi), per process or GPU
    smi_gap_growth_bytes: Optional[int] = None  # that gap at the last step's end minus at the first's
    unexplained_bytes: Optional[int] = None  # what the loads, statics and libraries named leave of the gap
    capture_flags: str = ""  # what to add to the capture (or beside it) to explain more
    message: str = ""


@dataclass(frozen=True)
class HiddenMemory:
    """`Analysis.hidden`: the memory nobody's allocations show, per process."""

    processes: list[ProcessCode] = field(default_factory=list)
    message: str = ""  # the answer line; "" when nothing needs saying


@dataclass(frozen=True)
class StepGraphs:
    """CUDA graph calls and captured memory of one step (or request) of one process."""

    name: str
    start_ns: int
    end_ns: int
    captured: int  # stream captures ended inside it
    instantiated: int
    destroyed: int  # executable graphs destroyed (cudaGraphExecDestroy) inside it
    launches: int
    captured_bytes: int  # live device bytes gained while its captures were open
    delta_bytes: Optional[int] = None  # the step's change of live device bytes (Analysis.steps)


@dataclass(frozen=True)
class ProcessGraphs:
    """The CUDA graphs of one process."""

    pid: int
    process: str
    captures: int  # stream captures begun (cudaStreamBeginCapture)
    instantiated: int  # cudaGraphInstantiate* calls
    exec_destroyed: int  # cudaGraphExecDestroy calls
    exec_destroyed_at_exit: int  # ... of them after the last step, graph launch or capture
    templates_destroyed: int  # cudaGraphDestroy calls (the graph an executable graph was made from)
    launches: int
    mem_nodes: int  # cudaGraphAddMemAllocNode calls (graph memory nodes)
    captured_bytes: int  # live device bytes gained while a capture was open, summed
    captured_min_bytes: int  # the smallest and largest of one step's (of one capture's without steps)
    captured_max_bytes: int
    steps_kept_bytes: Optional[int] = None  # what the steps with captures added to live bytes, summed
    per: str = "capture"  # what captured_min/max are per: the step's name family ("request N") or "capture"
    steps: list[StepGraphs] = field(default_factory=list)  # the listed steps that hold graph calls
    approximate: bool = False  # a timeline series was downsampled: bytes are its points', not exact
    message: str = ""


@dataclass(frozen=True)
class CudaGraphs:
    """`Analysis.graphs`: CUDA graphs captured, instantiated and destroyed, and their memory."""

    processes: list[ProcessGraphs] = field(default_factory=list)
    message: str = ""
