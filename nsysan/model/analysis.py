"""`Analysis`: everything nsysan found in one report, and its JSON document."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ..base import notebook_view
from ..errors import printable
from .bytes import ByteClasses
from .hidden import CudaGraphs, HiddenMemory
from .capture import GPU_RESIDENT_KINDS, SCHEMA_ID, SEVERITIES, Capture, Diagnostic, Source
from .memory import Allocation, AllocationGroup, ApiCallStat, FailedCall, GroupSummary, Peak, RangeFamily, RangeStat, \
    Site, Stack, StackBytes, Timeline, range_family
from .oom import OutOfMemory, ReservedMemory
from .plain import _to_plain, from_document
from .steps import Answer, Growth, MemoryCap, Phase, Spike, StepSeries, WhatIf
from .tables import RAW, Tables

if TYPE_CHECKING:  # made when used (model/__init__.py): plain.type_hints finds it for documents read back
    from .smi import SmiOverlay


@dataclass(frozen=True)
class Analysis(Tables):
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
    # Every never-freed allocation by call stack, largest first (capped): the never-freed flame graph
    never_freed_stacks: list[StackBytes] = field(default_factory=list)
    # What the bytes are (weights, activations, ...) at the peak and per step, per process and
    # device with forward/backward phases (analyses/byte_classes.py)
    byte_classes: list[ByteClasses] = field(default_factory=list)
    # The frames read from the export (pandas DataFrames), for notebooks; never serialized.
    events: Any = field(default=None, compare=False, repr=False, metadata=RAW)  # see nsysan.events
    calls: Any = field(default=None, compare=False, repr=False, metadata=RAW)  # memory API calls
    nvtx_ranges: Any = field(default=None, compare=False, repr=False, metadata=RAW)  # NVTX ranges
    # nvidia-smi logs against the trace (`analyze --smi`); absent from the JSON without them
    smi: Optional[SmiOverlay] = None
    # `--what-if-gpu SIZE`: the timeline replayed against SIZE; absent from the JSON without it
    what_if: Optional[WhatIf] = None
    # Contexts, code loads and library memory against nvidia-smi (analyses/hidden.py), and CUDA
    # graphs with the memory captured into them (analyses/graphs.py); empty with --quick
    hidden: HiddenMemory = field(default_factory=HiddenMemory)
    graphs: CudaGraphs = field(default_factory=CudaGraphs)
    # User NVTX ranges that differ only in their numbers ("step N"), one per family of 2+ names
    range_families: list[RangeFamily] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (`nsysan/analysis@1`) as plain dicts and lists; the raw frames are left out.

        >>> import nsysan
        >>> doc = nsysan.analyze("fixtures/known_mem_v25.sqlite").to_dict()
        >>> doc["schema"], doc["peak"]["peak_bytes"], "events" in doc
        ('nsysan/analysis@1', 952107008, False)
        """
        data = {f.name: _to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                if not f.metadata.get("raw")}
        # only analyses given nvidia-smi logs have the smi section, only those asked --what-if-gpu what_if
        for section in ("smi", "what_if"):
            if data[section] is None:
                del data[section]
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
        # Documents written before "scope" existed come from full analyses.
        with_scope = {"scope": "full", **data} if isinstance(data, dict) else data
        from ..errors import NsysanError  # lazily: the model stays free of I/O concerns

        if isinstance(data, dict) and data.get("schema") == SCHEMA_ID:
            missing = next((name for name in REQUIRED_SECTIONS if name not in data), None)
            if missing is not None:  # in every @1 document since the first: removed, not older
                raise NsysanError(f"field {missing!r} is missing")
        analysis = from_document(cls, with_scope, SCHEMA_ID, "analysis")
        _refuse_negative_sizes(analysis)
        return analysis

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
        from ..errors import NsysanError
        from .dataframes import RAW_FRAMES

        if name in RAW_FRAMES:
            raw = getattr(self, name)
            if raw is None:
                raise NsysanError(f"the {name} frame is read from the export and is not in an analysis "
                                  "JSON; analyze the report itself to have it")
            return raw
        return super().frame(name)

    def _repr_html_(self) -> Optional[str]:
        """The report page in a sandboxed frame, for a notebook cell: the view the package gives
        (nsysan/__init__.py; None, so the text repr, without it)."""
        return notebook_view.view(self) if notebook_view.view is not None else None

    def __repr__(self) -> str:
        """One short line: the file, the headline peak and the counts (the tables: `frame()`).

        >>> import nsysan
        >>> nsysan.analyze("fixtures/known_mem_v25.sqlite")     # doctest: +NORMALIZE_WHITESPACE
        <nsysan.Analysis of known_mem_v25.sqlite: peak 908.0 MiB (process 1313, device 0, at 517.08 ms
        in 'burst'); never freed 6 (146.0 MiB); failed calls 0; diagnostics: 1 warning, 1 info>
        """
        from ..base.units import fmt_bytes, fmt_time

        name = self.source.name if len(self.source.name) <= 80 else self.source.name[:77] + "..."
        parts = [f"<nsysan.Analysis of {name}" + (" (quick)" if self.scope == "quick" else "") + ":"]
        if self.peak is None:
            parts.append(" no memory events;")
        else:
            where = f"process {self.peak.pid}, device {self.peak.device}, at {fmt_time(self.peak.peak_time_ns)}"
            in_range = f" in {self.peak.nvtx_range[:40]!r}" if self.peak.nvtx_range else ""
            parts.append(f" peak {fmt_bytes(self.peak.peak_bytes)} ({where}{in_range});")
        leaked = self.never_freed_bytes  # what the headings say, also when not every allocation is listed
        parts.append(f" never freed {self.never_freed_total}" + (f" ({fmt_bytes(leaked)})" if leaked else "") + ";")
        parts.append(f" failed calls {len(self.failed_calls)};")
        if self.oom.failed_count or self.oom.allocator_ooms:
            parts.append(f" out of memory: {self.oom.failed_count} failed, "
                         f"{len(self.oom.allocator_ooms)} allocator gave up;")
        counts = {s: sum(d.severity == s for d in self.diagnostics) for s in SEVERITIES}
        parts.append(" diagnostics: " + (", ".join(f"{n} {s}" for s, n in counts.items() if n) or "none") + ">")
        return "".join(parts)

    @property
    def never_freed_bytes(self) -> int:
        """Bytes never freed during the capture, all processes and kinds but static memory (module
        globals, never freed by design): what the never-freed headings say (not in the JSON: the
        groups' own numbers are)."""
        return sum(g.never_freed_bytes for g in self.groups if g.kind not in ("static", "managed_static"))

    def peak_bytes_by_process(self) -> dict[int, int]:
        """Each process's highest peak in bytes, on any of its devices: how the outputs order
        processes.

        >>> import nsysan
        >>> nsysan.analyze("fixtures/ddp_leak_v25.sqlite").peak_bytes_by_process()
        {2146: 1125002330, 2147: 1745094656}
        """
        best: dict[int, int] = {}
        for peak in self.peaks:
            if peak.pid is not None:
                best[peak.pid] = max(best.get(peak.pid, 0), peak.peak_bytes)
        return best

    def gpu_peaks(self) -> dict[int, Peak]:
        """Each GPU's peak (by `Peak.gpu_or_device`): all its processes together (pid None) where
        several share it, the only case `peaks` lists that one, else its one process's highest peak.

        >>> import nsysan
        >>> {gpu: p.peak_bytes for gpu, p in nsysan.analyze("fixtures/ddp_leak_v25.sqlite").gpu_peaks().items()}
        {1: 1745094656, 0: 1125666996}
        """
        alone: dict[int, Peak] = {}
        for peak in sorted(self.peaks, key=lambda p: -p.peak_bytes):
            if peak.pid is not None:
                alone.setdefault(peak.gpu_or_device, peak)
        return {**alone, **{p.gpu_or_device: p for p in self.peaks if p.pid is None}}

    def devices_on_gpu(self, pid: int, gpu: Optional[int]) -> set[int]:
        """The CUDA devices (as `pid` numbered them) by which process `pid` used GPU `gpu` of the
        capture; a device whose GPU is not known counts as the GPU of its own number.

        >>> import nsysan
        >>> nsysan.analyze("fixtures/ddp_leak_v25.sqlite").devices_on_gpu(2147, 1)
        {1}
        """
        return {g.device for g in self.groups if g.pid == pid and (g.gpu == gpu or (g.gpu is None and g.device == gpu))}

    def resident_curve(self, pid: Optional[int], gpu: Optional[int]) -> Optional[tuple[Any, Any, int]]:
        """Process `pid`'s live GPU-resident bytes on GPU `gpu`, its kinds' timeline series summed:
        (times ns, bytes, both numpy arrays, the start of its first step or 0), None without a series.
        The steps are the analysis's (`steps`), else its NVTX bands named like a step.

        >>> import nsysan
        >>> ts, live, first_step = nsysan.analyze("fixtures/ddp_leak_v25.sqlite").resident_curve(2147, 1)
        >>> len(ts), int(live.max()), first_step
        (316, 1745094656, 13327155429)
        """
        import numpy as np

        devices = self.devices_on_gpu(pid, gpu) if pid is not None else set()  # None: a process of the other run
        series = [s for s in self.timeline.series
                  if s.pid == pid and s.device in devices and s.kind in GPU_RESIDENT_KINDS and s.ts_ns]
        if not series:
            return None
        ts = np.unique(np.concatenate([np.asarray(s.ts_ns, dtype=np.int64) for s in series]))
        live = np.zeros(len(ts), dtype=np.float64)
        for s in series:
            at = np.searchsorted(np.asarray(s.ts_ns, dtype=np.int64), ts, side="right") - 1
            values = np.asarray(s.live_bytes, dtype=np.float64)
            live += np.where(at >= 0, values[np.clip(at, 0, None)], 0.0)
        steps = [found.steps[0].start_ns for found in self.steps
                 if found.pid == pid and found.device in devices and found.steps]
        if not steps:
            steps = [b.start_ns for b in self.timeline.bands if b.pid == pid and _STEP_NAME.match(b.name)]
        return ts, live, min(steps) if steps else 0

    def process_peaks(self, limit: int = 4) -> list[Peak]:
        """Each process's highest peak with allocations live at it, largest first (the headline
        first): the peaks whose live allocations the summaries list.

        >>> import nsysan
        >>> ddp = nsysan.analyze("fixtures/ddp_leak_v25.sqlite")     # two ranks, two GPUs
        >>> [(p.pid, p.gpu) for p in ddp.process_peaks()]
        [(2147, 1), (2146, 0)]
        """
        best: dict[int, Peak] = {}
        for peak in sorted(self.peaks, key=lambda p: -p.peak_bytes):  # the first of equal ones
            if peak.pid is not None and peak.live_count:
                best.setdefault(peak.pid, peak)
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
        return next((proc.label for proc in self.capture.processes if proc.pid == pid and proc.label), f"process {pid}")

    def process_names(self) -> tuple[dict[int, str], dict[int, str]]:
        """How the pages name each process, profile text made printable: short ("rank 1", or
        "python3 (1644)" without a rank) for legends, callouts and the step chart, and long
        ("rank 1 (process 2147, python)") for the hover readout, where the pid ties it to the tables.

        >>> import nsysan
        >>> short, full = nsysan.analyze("fixtures/ddp_leak_v25.sqlite").process_names()
        >>> short[2147], full[2147]
        ('rank 1', 'rank 1 (process 2147, python)')
        """
        short: dict[int, str] = {}
        full: dict[int, str] = {}
        for p in self.capture.processes:
            name, label = printable(p.name), printable(self.process_label(p.pid))
            if label != f"process {p.pid}":  # a rank, as the headline and verdicts name it
                short[p.pid] = label
                full[p.pid] = f"{short[p.pid]} (process {p.pid}" + (f", {name})" if name else ")")
            else:
                short[p.pid] = f"{name} ({p.pid})" if name else f"process {p.pid}"
                full[p.pid] = f"{name} (process {p.pid})" if name else f"process {p.pid}"
        seen = {s.pid for s in self.timeline.series} | {p.pid for p in self.peaks if p.pid is not None}
        for pid in seen - set(short):  # not in the process table
            short[pid] = full[pid] = f"process {pid}"
        return short, full

    def range_rows(self) -> list[RangeStat | RangeFamily]:
        """The user's NVTX ranges (not operators) as the tables list them, in the order of `ranges`:
        those of a family ("step 0" ... "step 9") as the family's one row (`range_families`), where its
        first name was. Without sizes there is nothing summed to show: every range keeps its row.

        >>> import nsysan
        >>> [getattr(r, "label", r.name) for r in nsysan.analyze("fixtures/known_mem_v25.sqlite").range_rows()]
        ['burst', 'setup', 'async pool', 'step 0 – step 8', 'other kinds', 'worker 2 – worker 1', 'train']
        """
        families = {f.name: f for f in self.range_families} if self.capture.memory_usage_collected else {}
        rows: list[RangeStat | RangeFamily] = []
        for r in self.ranges:
            family = families.get(range_family(r.name)) if range_family(r.name) != r.name else None
            if r.operator or family is None:
                rows.extend([] if r.operator else [r])
            elif family not in rows:
                rows.append(family)
        return rows + [f for f in families.values() if f not in rows]  # a family none of whose names made the list

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


# An NVTX range named like a training step ("step 3", "train_step", "Training step 3")
_STEP_NAME = re.compile(r"^\s*(?:train(?:ing)?[ _-]?)?step\b", re.IGNORECASE)

# The sections of the first nsysan/analysis@1 document: sections added since read as empty when
# absent (an older document), these never do.
REQUIRED_SECTIONS = ("source", "capture", "groups", "peak", "peaks", "never_freed", "never_freed_total", "sites",
                     "api_calls", "failed_calls", "ranges", "timeline", "diagnostics")


def _refuse_negative_sizes(analysis: "Analysis") -> None:
    """The sizes compare and check read are sums of allocations: a negative one is an edited
    document (a baseline whose peak is -5 GiB would make any run pass a +10% limit)."""
    found = [("peak.peak_bytes", analysis.peak.peak_bytes)] if analysis.peak is not None else []
    found += [(f"peaks[{i}].peak_bytes", p.peak_bytes) for i, p in enumerate(analysis.peaks)]
    found += [(f"groups[{i}].{name}", getattr(g, name)) for i, g in enumerate(analysis.groups)
              for name in ("peak_bytes", "end_bytes", "allocated_bytes", "never_freed_bytes")]
    found += [(f"never_freed[{i}].bytes", a.bytes) for i, a in enumerate(analysis.never_freed)]
    found += [("never_freed_total", analysis.never_freed_total)]
    bad = next(((name, value) for name, value in found if value < 0), None)
    if bad is not None:
        from ..errors import NsysanError

        raise NsysanError(f"field {bad[0]!r} is negative ({bad[1]}), which no capture measures; the document "
                          "was edited or damaged, so write it again with nsysan analyze --format json")
