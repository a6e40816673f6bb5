"""Steps and growth (docs/analyses.md, "Steps and the growth verdict"), phases, spikes,
the answers shown first, and the caps a process's memory runs into."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .memory import Holder


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
    found_by: str  # "nvtx": repeated NVTX ranges; "step-range": the --step-range pattern; "kernels": the
    # repeating kernel sequence (no NVTX range repeats; analyses/iterations.py)
    steps: list[Step] = field(default_factory=list)  # in time order; the first and last when there are many
    step_count: Optional[int] = None  # steps found (the verdict judges them all); None: all are listed
    found_how: str = ""  # with "kernels": how, in a sentence ("steps found from the kernel sequence: ...")
    confidence: str = ""  # with "kernels": high | medium | low (analyses/iterations.py)


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
    # Where several processes have steps: the first step at which this one's growth departed from
    # every other's (growth.mark_departures), its delta then, and the most any other added then
    departure_step: Optional[int] = None
    departure_bytes: Optional[int] = None
    others_bytes: Optional[int] = None
    # The projection in time: capacity_step reached after about this long, at the median step time
    capacity_time_ns: Optional[int] = None
    step_time_ns: Optional[int] = None  # the median duration of the judged steps


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
class WhatIfGpu:
    """One GPU of a capture replayed against a smaller (or larger) capacity."""

    gpu: Optional[int]  # None: the CUDA device below, where the GPU is unknown
    device: int
    peak_bytes: int  # the most its processes held together (device + array + static), from the timeline
    fits: bool
    first_over_ns: Optional[int] = None  # the first moment the live bytes went over the capacity
    over_bytes: Optional[int] = None  # live then
    pid: Optional[int] = None  # the process whose allocation crossed it
    nvtx_path: str = ""  # NVTX ranges open on that process's main thread then, outermost first


@dataclass(frozen=True)
class WhatIfGrowth:
    """A growing process's steps left under the capacity, at its growth per step."""

    pid: int
    device: int
    process: str
    bytes_per_step: int
    end_live_bytes: int
    steps_allowed: int  # more steps after the last judged one before the capacity is reached
    at_step: int


@dataclass(frozen=True)
class WhatIf:
    """`analyze --what-if-gpu SIZE`: the capture's timeline replayed against SIZE per GPU."""

    capacity_bytes: int
    gpus: list[WhatIfGpu] = field(default_factory=list)
    growth: list[WhatIfGrowth] = field(default_factory=list)
    # True when a timeline series was downsampled (over MAX_POINTS events): the first moment is
    # then the highest point of its time bucket, at most 1/1000 of the capture after the real one
    approximate: bool = False
    message: str = ""
