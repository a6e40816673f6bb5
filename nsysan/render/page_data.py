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
from ..model import GPU_RESIDENT_KINDS, KINDS, Analysis, Series
from ..units import fmt_bytes


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
        key = peak.device if peak.gpu is None else peak.gpu
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
    names = {p.pid: printable(p.name) for p in analysis.capture.processes}
    gpus = {g.id: g for g in analysis.capture.gpus}
    several = len({s.pid for series in panels.values() for s in series}) > 1
    shared = {(p.device if p.gpu is None else p.gpu): p for p in analysis.peaks if p.pid is None}

    def panel(key: int, series: list[Series]) -> dict[str, Any]:
        gpu = gpus.get(key)
        title = f"GPU {key}" + (f" · {printable(gpu.name)}" if gpu else "")
        if gpu and gpu.total_memory_bytes:
            title += f" · {fmt_bytes(gpu.total_memory_bytes)}"
        if key in shared:
            title += f" · all processes: peak {fmt_bytes(shared[key].peak_bytes)}"
        return {
            "gpu": key, "title": title, "capacity": gpu.total_memory_bytes if gpu else None,
            "series": [{"pid": s.pid, "device": s.device, "kind": s.kind, "resident": s.kind in GPU_RESIDENT_KINDS,
                        "label": _series_label(s, key, names), "ts": s.ts_ns, "bytes": s.live_bytes}
                       for s in series],
        }

    peaks = [{"pid": p.pid, "panel": p.device if p.gpu is None else p.gpu, "device": p.device,
              "bytes": p.peak_bytes, "t": p.peak_time_ns,
              "label": (f"{p.pid}: " if several else "") + f"peak {fmt_bytes(p.peak_bytes)}"
                       + (f" · {printable(p.nvtx_range)}" if p.nvtx_range else "")}
             for p in analysis.peaks if p.pid is not None and p.peak_bytes > 0]
    sites: dict[str, int] = {}
    allocations = [[a.pid, a.device, a.kind, a.bytes, a.alloc_time_ns, a.free_time_ns, printable(a.nvtx_range),
                    sites.setdefault(printable(a.site.label), len(sites))]
                   for a in timeline.allocations]
    return {
        "start": timeline.start_ns, "end": timeline.end_ns,
        "focus": _focus(timeline.focus_start_ns, timeline.focus_end_ns),
        "names": {str(pid): name for pid, name in names.items()},
        "panels": [panel(key, series) for key, series in panels.items()],
        "peaks": peaks,
        "bands": [{"pid": b.pid, "panel": home[b.pid], "name": printable(b.name), "s": b.start_ns, "e": b.end_ns}
                  for b in timeline.bands if b.pid in home],
        "spans": [[s.pid, printable(s.name), s.start_ns, s.end_ns, s.depth] for s in timeline.spans],
        "failed": [{"pid": f.pid, "panel": home[f.pid], "t": f.time_ns, "bytes": f.live_bytes,
                    "label": f"{printable(f.api)} {printable(f.error)}"}
                   for f in analysis.failed_calls if f.pid in home],
        "traceEnds": [{"pid": e.pid, "panel": home.get(e.pid), "t": e.time_ns} for e in timeline.trace_ends],
        "allocations": {"sites": list(sites), "rows": allocations, "total": timeline.allocations_total},
    }


def _series_label(s: Series, panel_key: int, names: dict[int, str]) -> str:
    label = f"{s.pid} {names.get(s.pid, '')}".strip() + f" · {s.kind}"
    return label + (f" (device {s.device})" if s.device != panel_key else "")


def _focus(start: Optional[int], end: Optional[int]) -> Optional[list[int]]:
    return [start, end] if start is not None and end is not None else None
