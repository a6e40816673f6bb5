"""compare.html (one self-contained page), compare.png and compare.json of a `Comparison`, and the
data the page's timeline and step chart draw: both runs on one time axis per matched process and
GPU, in the shape report.js.j2 reads (see page_data.py).

The page is built from the report page's parts: its components (timeline, step chart), its CSS
and its script (uPlot inlined), under the same Content-Security-Policy (one hashed style, one
hashed script, nothing fetched). Every profile string is autoescaped; the page names the runs by
file name.

Nothing is computed but the placing: each run's times are moved by its own origin (the start of
its first step when both runs have steps, else its first memory event), so step 0 of one run
sits over step 0 of the other, at the time the longer lead before an origin takes (the axis starts
at 0, never below). With steps, the new run's clock is then stretched between its step starts to
the base run's (step_anchors), so that every step both runs have starts at one x, not only the
first. Every value is the runs' own. A series' `pid` is a key naming its
run ("base:2373", "new:1644"): the page's script groups the hover readout, the NVTX path and the
colours by it, and two runs may share a pid.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, Callable, Optional

from ..model.comparison import Comparison
from ..errors import printable
from ..model import GPU_RESIDENT_KINDS, KINDS, Analysis
from ..base.units import fmt_bytes
from .compare_plot import plot_comparison
from .html import _environment, content_security_policy, page_script, page_style
from .json import dumps
from .page_data import site_columns, step_sets
from .png import figure_png

# Written in this order, the page last: a folder with compare.html is complete.
COMPARE_FILES = ("compare.png", "compare.json", "compare.html")

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


def _step_times(run: Analysis) -> dict[int, tuple[int, int]]:
    """(start, end) of each step of the run's process and device with the most steps, by number."""
    series = max((s for s in run.steps if s.steps), key=lambda s: len(s.steps))
    return {step.number: (step.start_ns, step.end_ns) for step in series.steps}


def step_anchors(base: Analysis, new: Analysis) -> list[tuple[int, int]]:
    """(new run's time, base run's time) of the start of each step number both runs have, and of
    the end of the last: the points where the new run's clock is pinned to the base's. Steps that
    would run the clock backwards (numbers out of time order) are left out."""
    b, n = _step_times(base), _step_times(new)
    common = sorted(set(b) & set(n), key=lambda k: (n[k][0], k))
    pairs = [(n[k][0], b[k][0]) for k in common]
    if common:
        pairs.append((n[common[-1]][1], b[common[-1]][1]))
    anchors: list[tuple[int, int]] = []
    for new_t, base_t in pairs:
        if not anchors or (new_t > anchors[-1][0] and base_t > anchors[-1][1]):
            anchors.append((new_t, base_t))
    return anchors


def stretched(anchors: list[tuple[int, int]]) -> Callable[[int], int]:
    """The new run's time on the base run's clock: linear between two anchors, moved by the first
    (before it) or the last (after it)."""
    at = [a[0] for a in anchors]

    def clock(t: int) -> int:
        i = bisect_right(at, t) - 1
        if i < 0:
            return t - anchors[0][0] + anchors[0][1]
        if i >= len(anchors) - 1:
            return t - anchors[-1][0] + anchors[-1][1]
        (n0, b0), (n1, b1) = anchors[i], anchors[i + 1]
        return b0 + round((t - n0) * (b1 - b0) / (n1 - n0))
    return clock


def compare_page_data(c: Comparison, base: Analysis, new: Analysis) -> dict[str, Any]:
    """Timeline panels (one per matched process and GPU, both runs in each) and step lines of both runs."""
    on_steps = aligned_on_steps(base, new)
    anchors = step_anchors(base, new) if on_steps else []
    origins = {"base": anchors[0][1], "new": anchors[0][0]} if anchors else \
        {"base": run_origin(base, on_steps), "new": run_origin(new, on_steps)}
    # Both origins at `lead`, the longer of the runs' times before theirs: the axis starts at 0 with
    # the earlier capture start, never at a negative time, and the origins still line up.
    lead = max(0, *(origins[side] - run.timeline.start_ns for side, run in (("base", base), ("new", new))))
    shift = {side: origins[side] - lead for side in origins}
    clock = stretched(anchors) if anchors else None
    runs: dict[str, tuple[Analysis, Callable[[int], int]]] = {
        "base": (base, lambda t: t - shift["base"]),
        "new": (new, (lambda t: clock(t) - shift["base"]) if clock else (lambda t: t - shift["new"]))}
    names: dict[str, str] = {}
    short: dict[str, str] = {}
    step_lines = []
    for side, (run, _clock) in runs.items():
        run_short, run_long = run.process_names()
        names.update({f"{side}:{pid}": f"{side}: {label}" for pid, label in run_long.items()})
        short.update({f"{side}:{pid}": f"{side} {label}" for pid, label in run_short.items()})
        step_lines += [{**line, "label": f"{side} {line['label']}", "color": RUN_COLORS[side]}
                       for line in step_sets(run, run_short)]

    panels, peaks, bands, spans, failed, ends, allocations = [], [], [], [], [], [], []
    sites: dict[str, int] = {}
    home: dict[str, int] = {}
    kind_order = {k: i for i, k in enumerate(KINDS)}
    for index, row in enumerate(c.with_memory):
        series = []
        for side, pid, gpu in (("base", row.base_pid, row.base_gpu), ("new", row.new_pid, row.new_gpu)):
            run, page_time = runs[side]
            if pid is None:
                continue
            key = f"{side}:{pid}"
            home.setdefault(key, index)
            devices = run.devices_on_gpu(pid, gpu)
            for s in sorted((s for s in run.timeline.series if s.pid == pid and s.device in devices and s.ts_ns),
                            key=lambda s: (s.device, kind_order.get(s.kind, len(KINDS)))):
                series.append({"pid": key, "device": s.device, "kind": s.kind, "resident": s.kind in GPU_RESIDENT_KINDS,
                               "label": f"{side} · {s.kind}", "color": RUN_COLORS[side],
                               "ts": [page_time(t) for t in s.ts_ns], "bytes": s.live_bytes})
            for p in run.peaks:
                if p.pid == pid and p.device in devices and p.peak_bytes > 0:
                    peaks.append({"pid": key, "panel": index, "device": p.device, "bytes": p.peak_bytes,
                                  "t": page_time(p.peak_time_ns), "label": f"{side} peak {fmt_bytes(p.peak_bytes)}"})
        title = f"{printable(row.role)}: peak {fmt_bytes(row.peak.before)} → {fmt_bytes(row.peak.after)}"
        panels.append({"gpu": index, "title": title, "capacity": None, "series": series})

    for side, (run, page_time) in runs.items():
        def where(pid: int) -> Optional[int]:
            return home.get(f"{side}:{pid}")

        # The new run's NVTX bands only: one strip of labels per panel stays readable.
        if side == "new":
            bands += [{"pid": f"new:{b.pid}", "panel": where(b.pid), "name": printable(b.name),
                       "s": page_time(b.start_ns), "e": page_time(b.end_ns)} for b in run.timeline.bands if where(b.pid) is not None]
        spans += [[f"{side}:{s.pid}", printable(s.name), page_time(s.start_ns), page_time(s.end_ns), s.depth]
                  for s in run.timeline.spans]
        failed += [{"pid": f"{side}:{f.pid}", "panel": where(f.pid), "t": page_time(f.time_ns), "bytes": f.live_bytes,
                    "label": f"{side} {printable(f.api)} {printable(f.error)}"}
                   for f in run.failed_calls if where(f.pid) is not None]
        ends += [{"pid": f"{side}:{e.pid}", "panel": where(e.pid), "t": page_time(e.time_ns)}
                 for e in run.timeline.trace_ends if where(e.pid) is not None]
        allocations += [[f"{side}:{a.pid}", a.device, a.kind, a.bytes, page_time(a.alloc_time_ns),
                         None if a.free_time_ns is None else page_time(a.free_time_ns), printable(a.nvtx_range),
                         *site_columns(a, sites)]
                        for a in run.timeline.allocations]
    allocations.sort(key=lambda r: -r[3])

    starts = [s["ts"][0] for p in panels for s in p["series"]]
    start = min(page_time(run.timeline.start_ns) for run, page_time in runs.values())
    end = max(page_time(run.timeline.end_ns) for run, page_time in runs.values())
    focus = [_focus_edge(runs, min, "focus_start_ns"), _focus_edge(runs, max, "focus_end_ns")]
    return {
        "start": start, "end": end, "focus": focus if None not in focus and starts else None,
        "names": names, "short": short, "panels": panels, "peaks": peaks, "bands": bands, "spans": spans,
        "failed": failed, "traceEnds": ends,
        "allocations": {"sites": list(sites), "rows": allocations,
                        "total": base.timeline.allocations_total + new.timeline.allocations_total},
        "steps": step_lines, "alignedOnSteps": on_steps, "alignedAt": lead,
        "alignedSteps": max(0, len(anchors) - 1),  # step starts pinned to the base run's
    }


def _focus_edge(runs: dict, pick, field: str) -> Optional[int]:
    edges = [page_time(getattr(run.timeline, field)) for run, page_time in runs.values()
             if getattr(run.timeline, field) is not None]
    return pick(edges) if edges else None


def render_comparison_html(c: Comparison, base: Analysis, new: Analysis) -> str:
    """The comparison page as one string (UTF-8 HTML)."""
    style, script = page_style(), page_script()
    return _environment().get_template("compare.html.j2").render(
        c=c, csp=content_security_policy(style, script), style=style, script=script,
        data=compare_page_data(c, base, new), has_growth=any(d.growth_per_step for d in c.processes))


def comparison_files(c: Comparison, base: Analysis, new: Analysis) -> dict[str, str | bytes]:
    """compare.png, compare.json and compare.html, by name, in COMPARE_FILES' order (the command
    writes them, all or none: commands/outputs.py)."""
    files: dict[str, str | bytes] = {"compare.png": figure_png(plot_comparison(c, base, new)),
                                     "compare.json": dumps(c.to_dict()) + "\n",
                                     "compare.html": render_comparison_html(c, base, new)}
    return {name: files[name] for name in COMPARE_FILES}
