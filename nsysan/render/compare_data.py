"""The data compare.html's timeline and step chart draw: both runs on one time axis per matched
process and GPU, in the shape report.js.j2 reads (see page_data.py).

Nothing is computed but the placing: each run's times are moved by its own origin (the start of
its first step when both runs have steps, else its first memory event), so step 0 of one run
sits over step 0 of the other, at the time the longer lead before an origin takes (the axis starts
at 0, never below). Every value is the runs' own. A series' `pid` is a key naming its
run ("base:2373", "new:1644"): the page's script groups the hover readout, the NVTX path and the
colours by it, and two runs may share a pid.
"""

from __future__ import annotations

from typing import Any, Optional

from ..compare import Comparison, ProcessDelta
from ..errors import printable
from ..model import GPU_RESIDENT_KINDS, KINDS, Analysis
from ..units import fmt_bytes
from .page_data import process_names, site_columns, step_sets

# Base in grey, new in red, as in compare.png.
RUN_COLORS = {"base": "#7f7f7f", "new": "#d62728"}


def run_origin(run: Analysis, on_steps: bool) -> int:
    """Where a run's time axis starts on the page, ns on its own clock: its first step's start when
    `on_steps`, else its first memory event (the capture's start without any)."""
    if on_steps:
        return min(s.steps[0].start_ns for s in run.steps if s.steps)
    firsts = [s.ts_ns[0] for s in run.timeline.series if s.ts_ns]
    return min(firsts) if firsts else run.timeline.start_ns


def aligned_on_steps(base: Analysis, new: Analysis) -> bool:
    return all(any(s.steps for s in run.steps) for run in (base, new))


def compare_page_data(c: Comparison, base: Analysis, new: Analysis) -> dict[str, Any]:
    """Timeline panels (one per matched process and GPU, both runs in each) and step lines of both runs."""
    on_steps = aligned_on_steps(base, new)
    origins = {"base": run_origin(base, on_steps), "new": run_origin(new, on_steps)}
    # Both origins at `lead`, the longer of the runs' times before theirs: the axis starts at 0 with
    # the earlier capture start, never at a negative time, and the origins still line up.
    lead = max(0, *(origins[side] - run.timeline.start_ns for side, run in (("base", base), ("new", new))))
    runs = {"base": (base, origins["base"] - lead), "new": (new, origins["new"] - lead)}
    names: dict[str, str] = {}
    short: dict[str, str] = {}
    for side, (run, _origin) in runs.items():
        run_short, run_long = process_names(run)
        names.update({f"{side}:{pid}": f"{side}: {label}" for pid, label in run_long.items()})
        short.update({f"{side}:{pid}": f"{side} {label}" for pid, label in run_short.items()})

    rows = [d for d in c.processes if d.peak.before or d.peak.after]
    panels, peaks, bands, spans, failed, ends, allocations = [], [], [], [], [], [], []
    sites: dict[str, int] = {}
    home: dict[str, int] = {}
    for index, row in enumerate(rows):
        series = []
        for side, pid, gpu in (("base", row.base_pid, row.base_gpu), ("new", row.new_pid, row.new_gpu)):
            run, origin = runs[side]
            if pid is None:
                continue
            key = f"{side}:{pid}"
            home.setdefault(key, index)
            devices = _devices(run, pid, gpu)
            kind_order = {k: i for i, k in enumerate(KINDS)}
            for s in sorted((s for s in run.timeline.series if s.pid == pid and s.device in devices and s.ts_ns),
                            key=lambda s: (s.device, kind_order.get(s.kind, len(KINDS)))):
                series.append({"pid": key, "device": s.device, "kind": s.kind, "resident": s.kind in GPU_RESIDENT_KINDS,
                               "label": f"{side} · {s.kind}", "color": RUN_COLORS[side],
                               "ts": [t - origin for t in s.ts_ns], "bytes": s.live_bytes})
            for p in run.peaks:
                if p.pid == pid and p.device in devices and p.peak_bytes > 0:
                    peaks.append({"pid": key, "panel": index, "device": p.device, "bytes": p.peak_bytes,
                                  "t": p.peak_time_ns - origin, "label": f"{side} peak {fmt_bytes(p.peak_bytes)}"})
        panels.append({"gpu": index, "title": _title(row), "capacity": None, "series": series})

    for side, (run, origin) in runs.items():
        def where(pid: int) -> Optional[int]:
            return home.get(f"{side}:{pid}")

        # The new run's NVTX bands only: one strip of labels per panel stays readable.
        if side == "new":
            bands += [{"pid": f"new:{b.pid}", "panel": where(b.pid), "name": printable(b.name),
                       "s": b.start_ns - origin, "e": b.end_ns - origin} for b in run.timeline.bands if where(b.pid) is not None]
        spans += [[f"{side}:{s.pid}", printable(s.name), s.start_ns - origin, s.end_ns - origin, s.depth]
                  for s in run.timeline.spans]
        failed += [{"pid": f"{side}:{f.pid}", "panel": where(f.pid), "t": f.time_ns - origin, "bytes": f.live_bytes,
                    "label": f"{side} {printable(f.api)} {printable(f.error)}"}
                   for f in run.failed_calls if where(f.pid) is not None]
        ends += [{"pid": f"{side}:{e.pid}", "panel": where(e.pid), "t": e.time_ns - origin}
                 for e in run.timeline.trace_ends if where(e.pid) is not None]
        allocations += [[short.get(f"{side}:{a.pid}", f"{side} {a.pid}"), a.device, a.kind, a.bytes, a.alloc_time_ns - origin,
                         None if a.free_time_ns is None else a.free_time_ns - origin, printable(a.nvtx_range),
                         *site_columns(a, sites)]
                        for a in run.timeline.allocations]
    allocations.sort(key=lambda r: -r[3])

    starts = [s["ts"][0] for p in panels for s in p["series"]]
    start = min([base.timeline.start_ns - runs["base"][1], new.timeline.start_ns - runs["new"][1]])
    end = max([base.timeline.end_ns - runs["base"][1], new.timeline.end_ns - runs["new"][1]])
    focus = [_focus_edge(runs, min, "focus_start_ns"), _focus_edge(runs, max, "focus_end_ns")]
    step_lines = []
    for side, (run, _origin) in runs.items():
        run_short, _ = process_names(run)
        for line in step_sets(run, run_short):
            step_lines.append({**line, "label": f"{side} {line['label']}", "color": RUN_COLORS[side]})
    return {
        "start": start, "end": end, "focus": focus if None not in focus and starts else None,
        "names": names, "short": short, "panels": panels, "peaks": peaks, "bands": bands, "spans": spans,
        "failed": failed, "traceEnds": ends,
        "allocations": {"sites": list(sites), "rows": allocations,
                        "total": base.timeline.allocations_total + new.timeline.allocations_total},
        "steps": step_lines, "alignedOnSteps": on_steps, "alignedAt": lead,
    }


def _devices(run: Analysis, pid: int, gpu: Optional[int]) -> set[int]:
    """The CUDA devices of `pid` that are GPU `gpu` (or that ordinal, when the capture names no GPU)."""
    return {g.device for g in run.groups if g.pid == pid and (g.gpu == gpu or (g.gpu is None and g.device == gpu))}


def _title(row: ProcessDelta) -> str:
    return f"{printable(row.role)}: peak {fmt_bytes(row.peak.before)} → {fmt_bytes(row.peak.after)}"


def _focus_edge(runs: dict, pick, field: str) -> Optional[int]:
    edges = [getattr(run.timeline, field) - origin for run, origin in runs.values() if getattr(run.timeline, field) is not None]
    return pick(edges) if edges else None
