"""The model's nvidia-smi section: what nvidia-smi logs saw against the trace (`Analysis.smi`).

Kept apart from analysis.py, which imports it, so that the section reads alone. Same conventions:
frozen dataclasses, sizes in bytes, times in ns from the capture's session start (the trace
clock), `None` for "not known". `docs/json.md` documents every field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class SmiLogInfo:
    """One nvidia-smi log as read and placed on the trace clock."""

    name: str  # file name
    kind: str  # "gpu" (--query-gpu: memory.used) | "apps" (--query-compute-apps: used_memory)
    columns: list[str]  # its columns, as nvidia-smi names them
    samples: int  # rows read
    skipped_rows: int  # rows that could not be read (truncated, [N/A], garbage)
    first_ns: int  # its first and last sample on the trace clock
    last_ns: int
    interval_ns: int  # median time between two samples of one GPU or process
    max_gap_ns: int  # the longest time between two samples while it overlaps the capture
    overlaps: bool  # some sample falls inside the capture
    gpus: list[int] = field(default_factory=list)  # capture GPU ids it was matched to
    other_gpus: list[str] = field(default_factory=list)  # its GPUs (uuid or index) not in the capture
    rise_ns: Optional[int] = None  # its first rise (see docs/analyses.md), trace clock
    first_call_ns: Optional[int] = None  # the traced process's first CUDA call, what the rise is checked against
    first_alloc_ns: Optional[int] = None  # ... and its first allocation
    best_offset_ns: Optional[int] = None  # shift (added to its times) that makes it follow the trace best
    fit: Optional[float] = None  # correlation of the log with the trace at that shift (1 = perfect)
    aligned: Optional[bool] = None  # the check passed; None when it could not be made


@dataclass(frozen=True)
class SmiSeries:
    """One log's samples of one GPU (memory.used) or one process (used_memory), on the trace clock.

    Only samples near the capture are kept (see docs/analyses.md); `traced_bytes` is what the
    trace had live at the same instant: the process's GPU-resident bytes (device + array +
    static), or for a GPU every traced process's on it.
    """

    log: str
    kind: str  # "gpu" | "apps"
    gpu: Optional[int]  # capture GPU id
    pid: Optional[int]  # the process (apps logs); None for a GPU's memory.used
    ts_ns: list[int] = field(default_factory=list)
    used_bytes: list[int] = field(default_factory=list)  # what nvidia-smi showed
    traced_bytes: list[int] = field(default_factory=list)  # live in the trace then
    running: list[int] = field(default_factory=list)  # 1 while the traced process(es) ran, else 0


@dataclass(frozen=True)
class NotInTrace:
    """nvidia-smi minus the traced live bytes, over the samples taken while the process ran."""

    log: str
    gpu: Optional[int]
    pid: Optional[int]  # None: memory.used of the GPU against every traced process on it
    samples: int  # samples taken while the process(es) ran
    median_bytes: int  # median of (nvidia-smi - traced live bytes) over them
    max_bytes: int
    min_bytes: int
    smi_peak_bytes: int  # highest nvidia-smi value in the log (whole log)
    traced_peak_bytes: int  # the trace's exact peak while the process(es) ran


@dataclass(frozen=True)
class MissedBySampling:
    """What one log's sampling could not see of the exact timeline, in the window it covers."""

    log: str
    gpu: Optional[int]
    pid: Optional[int]
    window_start_ns: int  # its samples' span while the process(es) ran
    window_end_ns: int
    interval_ns: int  # median time between samples
    max_gap_ns: int  # longest time between samples: any excursion longer than this is caught
    highest_sample_bytes: int  # the highest value nvidia-smi recorded in the window
    highest_sample_ns: int
    sampled_peak_bytes: int  # the trace's live bytes at the sample instants: their highest
    exact_peak_bytes: int  # the trace's exact peak in the window
    exact_peak_ns: int
    missed_bytes: int  # exact_peak_bytes - sampled_peak_bytes
    time_above_ns: int  # time the exact timeline spent above sampled_peak_bytes
    spikes_missed: int  # separate excursions above sampled_peak_bytes
    longest_missed_ns: int  # the longest of them


@dataclass(frozen=True)
class OtherProcess:
    """A process an apps log shows on a GPU that is not in the trace."""

    pid: int
    name: str
    gpu: Optional[int]
    max_used_bytes: int
    samples: int


@dataclass(frozen=True)
class SomeoneElse:
    """Memory on a GPU that belongs to no traced process."""

    gpu: int
    log: str  # the gpu log
    before_bytes: Optional[int]  # memory.used at its last sample before the first traced process started
    apps_log: Optional[str] = None  # the apps log of the same GPU, when given
    unattributed_median_bytes: Optional[int] = None  # memory.used - every process of the apps log,
    unattributed_max_bytes: Optional[int] = None  # ... over the samples while the traced process(es) ran
    processes: list[OtherProcess] = field(default_factory=list)  # untraced processes the apps log shows


@dataclass(frozen=True)
class SmiOverlay:
    """nvidia-smi logs against the exact timeline (`nsysan analyze --smi LOG.csv`)."""

    tz: str  # zone the logs' timestamps were read in (--smi-tz; nvidia-smi writes local time)
    session_start_utc_ns: Optional[int]  # the capture's start (TARGET_INFO_SESSION_START_TIME), UTC epoch ns
    logs: list[SmiLogInfo] = field(default_factory=list)
    series: list[SmiSeries] = field(default_factory=list)
    not_in_trace: list[NotInTrace] = field(default_factory=list)
    missed: list[MissedBySampling] = field(default_factory=list)
    someone_else: list[SomeoneElse] = field(default_factory=list)
