"""`Comparison`: two runs side by side, the documented JSON `nsysan/compare@1` (docs/json.md).

The logic that makes one from two `Analysis` objects is nsysan/runs/compare_runs.py; these are its results,
read by the renderers and by `check`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .plain import from_document
from .tables import Tables

COMPARE_SCHEMA_ID = "nsysan/compare@1"


@dataclass(frozen=True)
class Change:
    """One number before and after. `percent` is None when there was nothing before."""

    before: Optional[int]
    after: Optional[int]
    delta: Optional[int]
    percent: Optional[float]

    @staticmethod
    def of(before: Optional[int], after: Optional[int]) -> "Change":
        if before is None or after is None:
            return Change(before, after, None, None)
        delta = after - before
        percent = round(100.0 * delta / before, 2) if before else None
        return Change(before, after, delta, percent)

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class RunRef:
    """One side of the comparison."""

    name: str
    path: str
    peak_bytes: Optional[int]  # the run's headline peak (highest per-process GPU peak)
    processes: int


@dataclass(frozen=True)
class ProcessDelta:
    """One matched (process, GPU) before and after."""

    role: str  # how it is shown: "GPU 0", "rank 1 · GPU 1", "python3 #2 · GPU 0"
    base_pid: Optional[int]  # None: the process has no match in the base run
    new_pid: Optional[int]  # None: the process has no match in the new run
    base_gpu: Optional[int]
    new_gpu: Optional[int]
    peak: Change  # GPU-resident bytes (device + array + static) at the process's peak
    end: Change  # GPU-resident bytes live at the end of the capture
    never_freed: Change  # device + array bytes never freed (static module memory left out)
    growth_per_step: Optional[Change] = None  # bytes per step (median step delta), when a run has steps
    growth_before: Optional[str] = None  # the base run's growth verdict: growing | uneven | stable | ...
    growth_after: Optional[str] = None  # the new run's


@dataclass(frozen=True)
class SiteDelta:
    """An allocation site (matched by label and kind) whose bytes changed."""

    label: str
    kind: str
    status: str  # grew | shrank | appeared | vanished
    max_live: Change  # the most the site held at one moment
    allocated: Change
    never_freed: Change


@dataclass(frozen=True)
class RangeDelta:
    """An NVTX range name whose peak while open or kept bytes grew."""

    name: str
    max_live: Change  # highest live bytes while it was open
    still_live: Change  # allocated inside and still live at the end


@dataclass(frozen=True)
class CaptureNote:
    """Why some numbers of the two runs are not compared: the runs were captured differently."""

    code: str  # sizes_missing | quick_analysis | stacks_differ | allocators_differ
    message: str  # one line: which run, what it lacks, what to capture


@dataclass(frozen=True)
class Comparison(Tables):  # Tables: frame("processes") etc. for notebooks
    schema: str  # "nsysan/compare@1"
    base: RunRef
    new: RunRef
    matched_by: str  # rank | gpu | name
    identical: bool  # no number differs anywhere
    headline: str  # the verdict in one line
    processes: list[ProcessDelta]
    sites: list[SiteDelta]  # largest change of max_live first
    ranges: list[RangeDelta]  # largest growth first
    unchanged_sites: int = 0
    # Runs captured differently (one without sizes, call stacks, or with another allocator): what
    # is not compared and why. Their sites are then not compared (`sites` is empty): the same
    # allocations carry other names on each side, and would read as vanished and appeared.
    notes: list[CaptureNote] = field(default_factory=list)

    def __repr__(self) -> str:
        """One line, for notebooks: the runs and the headline (the tables: `frame()`).

        >>> import nsysan
        >>> nsysan.compare("fixtures/torch_clean_v25.sqlite", "fixtures/torch_leak_v25.sqlite")
        <nsysan.Comparison torch_clean_v25.sqlite -> torch_leak_v25.sqlite: peak +3.5 GiB (+201.9%) on GPU 0; new growth of 735.0 MiB per step on GPU 0; top growing site: cudaMalloc in forward [python3] (+1.9 GiB)>
        """
        text = f"<nsysan.Comparison {self.base.name[:80]} -> {self.new.name[:80]}: {self.headline}"
        return (text if len(text) < 480 else text[:477] + "...") + ">"

    @property
    def with_memory(self) -> list[ProcessDelta]:
        """The matched processes that held memory in either run: the panels compare.png and
        compare.html draw, in the order of `processes`."""
        return [d for d in self.processes if d.peak.before or d.peak.after]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Comparison":
        """Rebuild a Comparison from its JSON document (`nsysan compare --format json`); raises
        NsysanError naming the schema found or the first field missing or of the wrong type.

        >>> Comparison.from_dict({"schema": "nsysan/compare@1", "base": {}})
        Traceback (most recent call last):
        nsysan.errors.NsysanError: field 'base.name' is missing
        >>> Comparison.from_dict({"schema": "nsysan/analysis@1"})
        Traceback (most recent call last):
        nsysan.errors.NsysanError: not an nsysan comparison (schema 'nsysan/analysis@1', expected 'nsysan/compare@1')
        """
        return from_document(cls, data, COMPARE_SCHEMA_ID, "comparison")


@dataclass(frozen=True)
class ProcessRow:
    """One (process, CUDA device) of one run, with the numbers compared (and batch's summary rows)."""

    pid: int
    name: str
    device: int
    gpu: Optional[int]
    peak_bytes: int
    end_bytes: int
    never_freed_bytes: int
    rank: Optional[int] = None
    growth_per_step: Optional[int] = None
    growth_verdict: Optional[str] = None
    first_ns: int = 0
