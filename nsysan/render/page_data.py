"""The data the report page's script draws, shaped for it: the timeline per GPU, the peaks, bands,
NVTX ranges, failed calls, trace ends and the largest allocations with their lifetimes.

Nothing here computes a number: values come from the `Analysis` as they are, grouped by the panel
(GPU) they are drawn on and with their labels formatted by the shared helpers. The page embeds
this as JSON in a `<script type="application/json">` element through jinja's `|tojson`, which
escapes `<`, `>`, `&` and `'`: a profile string can't close the element. Strings from the
profile go through `printable` first, as everywhere else in the page.
"""

from __future__ import annotations

from typing import Any, Optional

from ..errors import printable
from ..model.bytes import BYTE_CLASSES
from ..model import GPU_RESIDENT_KINDS, KINDS, Allocation, AllocationGroup, Analysis, CallSite, NvtxSpan, Series, Stack, \
    StackBytes
from ..model.memory import site_in_family
from ..model.smi import SmiOverlay, SmiSeries
from ..base.units import fmt_bytes, fmt_frame


def series_by_gpu(analysis: Analysis) -> dict[int, list[Series]]:
    """Series per GPU (the GPU id, or the CUDA ordinal when the capture does not say), in order."""
    gpu_of = {(g.pid, g.device): g.gpu for g in analysis.groups}
    panels: dict[int, list[Series]] = {}
    for s in analysis.timeline.series:
        if not s.ts_ns:
            continue
        gpu = gpu_of.get((s.pid, s.device))
        panels.setdefault(s.device if gpu is None else gpu, []).append(s)
    kind_order = {k: i for i, k in enumerate(KINDS)}
    return {key: sorted(panels[key], key=lambda s: (s.pid, s.device, kind_order.get(s.kind, len(KINDS))))
            for key in sorted(panels)}


def home_panels(analysis: Analysis, panels: dict[int, list[Series]]) -> dict[int, int]:
    """The panel each process's NVTX bands and failed calls go to: the GPU of its highest peak."""
    home: dict[int, int] = {}
    best: dict[int, int] = {}
    for peak in analysis.peaks:
        key = peak.gpu_or_device
        if peak.pid is not None and key in panels and peak.peak_bytes > best.get(peak.pid, -1):
            best[peak.pid], home[peak.pid] = peak.peak_bytes, key
    for key, series in panels.items():  # a process without a GPU-resident peak: its first panel
        for s in series:
            home.setdefault(s.pid, key)
    return home


def page_data(analysis: Analysis) -> dict[str, Any]:
    """Everything the page's timeline, hover, click list and step chart read (see report.js.j2)."""
    timeline = analysis.timeline
    panels = series_by_gpu(analysis)
    home = home_panels(analysis, panels)
    short, names = analysis.process_names()
    gpus = {g.id: g for g in analysis.capture.gpus}
    several = len({s.pid for series in panels.values() for s in series}) > 1
    gpu_peaks = analysis.gpu_peaks()

    def panel(key: int, series: list[Series]) -> dict[str, Any]:
        gpu = gpus.get(key)
        title = f"GPU {key}" + (f" · {printable(gpu.name)}" if gpu else "")
        if gpu and gpu.total_memory_bytes:
            title += f" · {fmt_bytes(gpu.total_memory_bytes)}"
        if key in gpu_peaks and gpu_peaks[key].pid is None:
            title += f" · all processes: peak {fmt_bytes(gpu_peaks[key].peak_bytes)}"
        return {
            "gpu": key, "title": title, "capacity": gpu.total_memory_bytes if gpu else None,
            "series": [{"pid": s.pid, "device": s.device, "kind": s.kind, "resident": s.kind in GPU_RESIDENT_KINDS,
                        "label": f"{short[s.pid]} · {s.kind}" + (f" (device {s.device})" if s.device != key else ""),
                        "ts": s.ts_ns, "bytes": s.live_bytes}
                       for s in series],
            "smi": smi_lines(analysis, key, short),
        }

    peaks = [{"pid": p.pid, "panel": p.gpu_or_device, "device": p.device,
              "bytes": p.peak_bytes, "t": p.peak_time_ns,
              "label": (f"{short[p.pid]}: " if several else "") + f"peak {fmt_bytes(p.peak_bytes)}"
                       + (f" · {printable(p.nvtx_range)}" if p.nvtx_range else "")}
             for p in analysis.peaks if p.pid is not None and p.peak_bytes > 0]
    sites: dict[str, int] = {}
    stacks = PageStacks(analysis)
    allocations = [[a.pid, a.device, a.kind, a.bytes, a.alloc_time_ns, a.free_time_ns, printable(a.nvtx_range),
                    *site_columns(a, sites), stacks.index(a.stack_id if a.stack_id is not None else a.site.stack_id,
                                                          a.site)]
                   for a in timeline.allocations]
    live_sets = moments(analysis, home, sites, stacks)
    return {
        "start": timeline.start_ns, "end": timeline.end_ns,
        "focus": None if timeline.focus_start_ns is None or timeline.focus_end_ns is None
        else [timeline.focus_start_ns, timeline.focus_end_ns],
        "names": {str(pid): name for pid, name in names.items()},
        "short": {str(pid): name for pid, name in short.items()},
        "panels": [panel(key, series) for key, series in panels.items()],
        "peaks": peaks,
        "bands": [{"pid": b.pid, "panel": home[b.pid], "name": printable(b.name), "s": b.start_ns, "e": b.end_ns}
                  for b in timeline.bands if b.pid in home],
        "spans": [[s.pid, printable(s.name), s.start_ns, s.end_ns, s.depth] for s in timeline.spans],
        "operators": operator_rows(timeline.operator_spans),
        "failed": [{"pid": f.pid, "panel": home[f.pid], "t": f.time_ns, "bytes": f.live_bytes,
                    "label": f"{printable(f.api)} {printable(f.error)}"}
                   for f in analysis.failed_calls if f.pid in home],
        "traceEnds": [{"pid": e.pid, "panel": home.get(e.pid), "t": e.time_ns} for e in timeline.trace_ends],
        "ooms": oom_marks(analysis, home),
        "allocations": {"sites": list(sites), "rows": allocations, "total": timeline.allocations_total},
        **live_sets, "stacks": stacks.shown,
        "steps": step_sets(analysis, short),
        "byteClasses": byte_class_sets(analysis, short),
    }


def operator_rows(spans: list[NvtxSpan]) -> dict[str, list]:
    """The operator ranges for the page's deepest tracks: a few operator names repeat thousands of
    times, so each row names its operator by index into `names` ([pid, name, start, end, depth])."""
    names: dict[str, int] = {}
    rows = [[s.pid, names.setdefault(printable(s.name), len(names)), s.start_ns, s.end_ns, s.depth] for s in spans]
    return {"names": list(names), "rows": rows}


def site_columns(a: Allocation, sites: dict[str, int]) -> list[int]:
    """An allocation's site and its site as a family (a site named by its range: "cudaMalloc in step
    N [python]"), as indexes into the page's `sites` (added there when new): the click list joins the
    blocks one site kept in every step on one row."""
    return [sites.setdefault(printable(a.site.label), len(sites)),
            sites.setdefault(printable(site_in_family(a.site.label, a.nvtx_range)), len(sites))]


STACK_FRAMES = 16


def site_stack(stack: Stack, site: CallSite) -> dict[str, list[str]]:
    """A site's call stack for the click list, the user's frames first: from the frame the site
    names outward, then the frames inside it (the profiler, the driver, the allocator, the
    framework), which the list folds behind one line; at most STACK_FRAMES of each."""
    at = next((i for i, f in enumerate(stack.frames) if site.function and f.function == site.function
               and (not site.file or f.file == site.file) and (site.line is None or f.line == site.line)), 0)
    shown = [printable(fmt_frame(f.function, f.file, f.line, f.module)) for f in stack.frames]
    return {"frames": shown[at:][:STACK_FRAMES], "inner": shown[:at][-STACK_FRAMES:]}


class PageStacks:
    """The call stacks the page shows, each once (site_stack's split), by index: allocations,
    the flame graphs' leaves and the click list's groups refer to them by number."""

    def __init__(self, analysis: Analysis) -> None:
        self.stacks = {s.id: s for s in analysis.stacks}
        # A site by its label, for the flame graphs' leaves (StackBytes names its site by label):
        # where the user's frames end in a stack
        self.sites: dict[str, CallSite] = {}
        for held in [*analysis.timeline.allocations, *analysis.never_freed,
                     *(a for p in analysis.peaks for a in p.live_at_peak), *analysis.never_freed_groups,
                     *(g for p in analysis.peaks for g in p.live_groups), *analysis.sites]:
            self.sites.setdefault(held.site.label, held.site)
        self.shown: list[dict[str, list[str]]] = []
        self._numbers: dict[tuple[int, str], int] = {}

    def index(self, stack_id: Optional[int], site: Optional[CallSite]) -> int:
        """The page's number of this stack split at `site`'s frame; -1 without a stack."""
        if stack_id is None or stack_id not in self.stacks:
            return -1
        key = (stack_id, site.label if site else "")
        if key not in self._numbers:
            self._numbers[key] = len(self.shown)
            self.shown.append(site_stack(self.stacks[stack_id], site or CallSite(label="")))
        return self._numbers[key]

    def of_label(self, stack_id: Optional[int], label: str) -> int:
        return self.index(stack_id, self.sites.get(label, CallSite(label=label)))


# Processes whose peak the page carries whole (flame graph and click list): the headline's first
MOMENT_PEAKS = 8


def moments(analysis: Analysis, home: dict[int, int], sites: dict[str, int], stacks: PageStacks) -> dict[str, Any]:
    """What was live at each process's peak, whole (every block, by call stack and by group: the
    model's `live_stacks` and `live_groups`), and what was never freed by call stack: the flame
    graphs and the click list at a peak. At other moments the page has its listed allocations."""
    def leaves(found: list[StackBytes]) -> list[list[Any]]:
        return [[s.pid, s.device, s.kind, sites.setdefault(printable(s.site), len(sites)),
                 stacks.of_label(s.stack_id, s.site), s.bytes, s.count, s.first_alloc_ns] for s in found]

    def groups(found: list[AllocationGroup]) -> list[list[Any]]:
        return [[g.pid, g.device, g.kind, sites.setdefault(printable(g.site.label), len(sites)),
                 printable(g.nvtx_range), g.count, g.total_bytes, g.min_bytes, g.max_bytes, g.first_alloc_ns,
                 stacks.index(g.site.stack_id, g.site), g.members] for g in found]

    peaks = [{"pid": p.pid, "device": p.device, "panel": home.get(p.pid), "t": p.peak_time_ns, "bytes": p.peak_bytes,
              "reserve": p.pool_reserve_bytes, "count": p.live_count, "leaves": leaves(p.live_stacks),
              "groups": groups(p.live_groups)}
             for p in analysis.process_peaks(MOMENT_PEAKS) if p.live_stacks and p.pid in home]
    return {"livePeaks": peaks,
            "neverFreed": {"bytes": analysis.never_freed_bytes, "count": analysis.never_freed_total,
                           "leaves": leaves(analysis.never_freed_stacks)}}


def oom_marks(analysis: Analysis, home: dict[int, int]) -> list[dict[str, Any]]:
    """Where a process ran out of memory with no failed call to mark (those are the ✕ of `failed`):
    where its allocator gave up (released its cache and allocated nothing after), or, for an
    out-of-memory error only the --log shows, its last memory event inside the ranges it never closed."""
    marks = []
    for x in analysis.oom.allocator_ooms:
        r = x.release
        if r.pid in home:
            marks.append({"pid": r.pid, "panel": home[r.pid], "t": r.start_ns, "bytes": r.live_before_bytes,
                          "label": "out of memory: the allocator gave up"
                                   + (f" in {printable(r.nvtx_path)}" if r.nvtx_path else "")})
    marked = {m["pid"] for m in marks}
    logged = {f.pid for f in analysis.oom.fatal if "log" in f.found_by}
    for e in analysis.oom.ended_inside:
        if e.pid in logged and e.pid not in marked and e.pid in home:
            marks.append({"pid": e.pid, "panel": home[e.pid], "t": e.last_event_ns, "bytes": e.live_bytes,
                          "label": "out of memory (its log)" + (f" in {printable(e.open_ranges[-1])}"
                                                                if e.open_ranges else "")})
    return marks


def smi_lines(analysis: Analysis, panel_key: int, short: dict[int, str]) -> list[dict[str, Any]]:
    """What nvidia-smi showed on this GPU (`analyze --smi`), drawn over the traced lines: memory.used
    of the GPU, or one process's used_memory, per log, as sampled (the gap to the traced lines is
    what the trace does not see)."""
    return [{"label": f"nvidia-smi {printable(s.log)}: " + ("memory.used" if s.pid is None else
                                                           f"{short.get(s.pid, f'process {s.pid}')} used_memory"),
             "ts": s.ts_ns, "bytes": s.used_bytes} for s in smi_series(analysis.smi, panel_key)]


def smi_series(smi: Optional[SmiOverlay], gpu: int) -> list[SmiSeries]:
    """The nvidia-smi series of one GPU panel."""
    return [s for s in smi.series if s.gpu == gpu and s.ts_ns] if smi is not None else []


def step_sets(analysis: Analysis, short: dict[int, str]) -> list[dict[str, Any]]:
    """The step chart's lines, one per (process, device) with steps: each step's number and the
    live bytes at its end (None for a step whose trace stopped before it ended), and the growth
    verdict's line (its bytes per step over the judged steps, ending at the last one's live bytes)."""
    verdicts = {(g.pid, g.device): g for g in analysis.growth}
    several = {s.pid for s in analysis.steps if sum(t.pid == s.pid for t in analysis.steps) > 1}
    sets = []
    for series in analysis.steps:
        if not series.steps:
            continue
        label = short.get(series.pid, f"process {series.pid}")
        if series.pid in several:
            label += f" · GPU {series.gpu}" if series.gpu is not None else f" · device {series.device}"
        g = verdicts.get((series.pid, series.device))
        judged = g is not None and g.first_step is not None and g.last_step is not None and g.verdict != "too_few_steps"
        sets.append({
            "pid": series.pid, "device": series.device,
            "label": label, "name": printable(series.range_name),
            "points": [[s.number, s.end_live_bytes if s.traced else None, printable(s.name)] for s in series.steps],
            "count": series.step_count if series.step_count is not None else len(series.steps),
            "growth": {"first": g.first_step, "last": g.last_step, "per_step": g.bytes_per_step, "end": g.end_live_bytes,
                       "verdict": g.verdict, "text": f"{g.verdict}: {fmt_bytes(g.bytes_per_step)}/step"} if judged else None,
        })
    return sets


def byte_class_sets(analysis: Analysis, short: dict[int, str]) -> list[dict[str, Any]]:
    """The stacked area of what the bytes are (analysis.byte_classes), one per (process, device):
    each step's classes at its highest point, in BYTE_CLASSES' order, bottom up."""
    return [{"pid": b.pid, "device": b.device, "label": short.get(b.pid, f"process {b.pid}"),
             "level": printable(b.label), "classes": list(BYTE_CLASSES),
             "steps": [[printable(s.label), [getattr(s, f"{c}_bytes") for c in BYTE_CLASSES]] for s in b.steps],
             "count": b.step_count, "peak": printable(b.message)} for b in analysis.byte_classes if b.steps]
