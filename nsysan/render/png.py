"""PNG plots of an `Analysis`: the memory timeline per GPU and the top allocation sites.

Figures are built with `matplotlib.figure.Figure` and drawn by the Agg canvas, never through
pyplot: no global figure manager, no backend switch at import, nothing shown on a screen.
Matplotlib's own defaults are used whatever the user's matplotlibrc says (a `text.usetex: True`
there would otherwise need LaTeX). Strings from the profile are drawn as plain text: a `$` in
an NVTX name is escaped so it never starts mathtext.

Timeline rules (docs/report.md):

- one panel per GPU that has memory series; a series (process, CUDA device, kind) goes to the
  GPU its (pid, device) maps to in `analysis.groups`;
- one step line per series, y in GiB, MiB or KiB (the largest unit the panel reaches), x in ms
  or s (s from a 1 s span on);
- each process peak (`analysis.peaks` with a pid) is marked and labelled, e.g.
  "peak 908.0 MiB · burst";
- the GPU's memory is a dashed line when the panel reaches at least `CAPACITY_LINE_SHARE` of it,
  else the capacity is stated in the panel title (a line at 139.8 GiB would squash a 1 GiB curve
  flat);
- NVTX bands and failed calls of a process are drawn on the panel of its highest peak (one panel
  per process, so the bands of processes sharing the GPU of someone else's peak don't pile up);
- nvidia-smi samples (`analysis.smi.series`): each log's as a thin step line with a dot per
  sample, over the trace's exact live bytes: the gap between them is what no allocation shows,
  the dots show how coarse the sampling was (gids "smi:<log>:<gpu>:<pid or all>").
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Iterator, Optional

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..model import GPU_RESIDENT_KINDS, Analysis, Gpu, Peak, Series
from ..model.smi import SmiOverlay
from ..base.units import fmt_bytes, fmt_time
from .page_data import home_panels, series_by_gpu, smi_series

# Draw the capacity line when the panel reaches this share of the GPU's memory.
CAPACITY_LINE_SHARE = 0.25
MAX_BAND_LABELS = 20
DPI = 200  # 2x: sharp on dense screens, and still readable when a tracker scales it down
WIDTH_IN = 12.0
PANEL_HEIGHT_IN = 3.9

_BYTE_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))
_KIND_STYLE = {"device": "-", "array": "-", "static": ":", "managed": "-.", "managed_static": ":",
               "pinned": "--", "pageable": "--", "unknown": "-"}
_BAND_SHADES = ("#dbe4ef", "#eef2f7")
_PEAK_COLOR = "#111111"
_FAILED_COLOR = "#d62728"
_NEVER_FREED_COLOR = "#d62728"
_ALLOCATED_COLOR = "#9ecae1"
_SMI_MARKERS = ("o", "s", "^", "D")
_SMI_COLORS = ("#7f7f7f", "#bcbd22", "#17becf", "#8c564b")


def plot_timeline(analysis: Analysis) -> Figure:
    """Live bytes over time, one panel per GPU with memory, from `analysis.timeline` and the peaks.

    Artists carry gids tests and readers can find: "series:<pid>:<device>:<kind>" (the lines),
    "peak:<pid>:<device>" (annotations), "capacity", "band", "failed".
    """
    with matplotlib_defaults():
        panels = series_by_gpu(analysis)
        if not panels:
            fig = Figure(figsize=(WIDTH_IN, 1.2), dpi=DPI)
            why = ("sizes were not collected (capture with --cuda-memory-usage=true)"
                   if not analysis.capture.memory_usage_collected else "no allocations were recorded")
            fig.text(0.5, 0.5, f"No memory timeline: {why}", ha="center", va="center", fontsize=12)
            return fig
        panels, left_out = _bounded(panels)
        fig = Figure(figsize=(WIDTH_IN, PANEL_HEIGHT_IN * len(panels) + (0.3 if left_out else 0)), dpi=DPI,
                     layout="constrained")
        if left_out:
            fig.suptitle(left_out, fontsize=9, color="#555555")
        axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
        home = home_panels(analysis, panels)
        start, stop = _window(analysis, panels, home)
        t_unit, t_scale = ("s", 1e9) if stop - start >= 1_000_000_000 else ("ms", 1e6)
        for ax, (gpu_key, series) in zip(axes, panels.items()):
            drawn = {s.pid for s in series}
            _draw_panel(ax, analysis, gpu_key, series,
                        [pid for pid, key in home.items() if key == gpu_key and pid in drawn], (start, stop), t_scale)
        axes[-1].set_xlabel(f"time since capture start ({t_unit})")
        axes[-1].set_xlim(start / t_scale, stop / t_scale)
        return fig


# Memory kinds that are loaded with the GPU code and freed only at exit: never a leak.
STATIC_KINDS = ("static", "managed_static")


def plot_sites(analysis: Analysis, top: int = 15) -> Figure:
    """The `top` sites by bytes allocated, as horizontal bars, with never-freed bytes over them.

    Bars carry gids "allocated" and "never_freed"; the labels are the site labels and kinds.
    """
    with matplotlib_defaults():
        sites = analysis.sites[:top]
        if not sites:
            fig = Figure(figsize=(WIDTH_IN, 1.2), dpi=DPI)
            fig.text(0.5, 0.5, "No allocation sites: no allocation sizes were recorded", ha="center", va="center",
                     fontsize=12)
            return fig
        fig = Figure(figsize=(WIDTH_IN, 1.5 + 0.42 * len(sites)), dpi=DPI, layout="constrained")
        ax = fig.add_subplot()
        unit, scale = byte_unit(max(s.allocated_bytes for s in sites))
        y = np.arange(len(sites))[::-1]  # the biggest on top
        allocated = np.array([s.allocated_bytes for s in sites], dtype=float) / scale
        # Static module memory (kernel images' globals) is never freed by design: never drawn as a leak.
        leaks = [s.never_freed_bytes if s.kind not in STATIC_KINDS else 0 for s in sites]
        never = np.array(leaks, dtype=float) / scale
        for bar in ax.barh(y, allocated, height=0.7, color=_ALLOCATED_COLOR, label="allocated"):
            bar.set_gid("allocated")
        for bar in ax.barh(y, never, height=0.38, color=_NEVER_FREED_COLOR, label="never freed"):
            bar.set_gid("never_freed")
        for yi, value, site in zip(y, allocated, sites):
            note = fmt_bytes(site.allocated_bytes)
            if site.kind in STATIC_KINDS:
                note += " · static, not a leak"
            elif site.never_freed_count:
                note += f" · never freed {fmt_bytes(site.never_freed_bytes)} ({site.never_freed_count})"
            ax.annotate(note, xy=(value, yi), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_yticks(y, [_plain(_short(f"{s.site.label} · {s.kind}", 70)) for s in sites], fontsize=8)
        ax.set_xlim(0, float(allocated.max()) * 1.3)
        ax.set_xlabel(f"bytes allocated during the capture ({unit})")
        ax.set_title(f"Top {len(sites)} allocation sites by bytes allocated", loc="left", fontsize=11)
        ax.grid(axis="x", alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        return fig


def figure_png(fig: Figure) -> bytes:
    """The figure drawn by Agg as PNG bytes."""
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: drawing needs no pyplot
    buffer = io.BytesIO()
    with matplotlib_defaults(), warnings.catch_warnings():
        # A CJK or emoji NVTX name lacks glyphs in DejaVu Sans: drawn as boxes, no warning storm.
        warnings.filterwarnings("ignore", message="Glyph .* missing from")
        fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


# (width px, colours) tried in turn until the picture fits STAND_IN_BYTES: a one-GPU timeline fits
# the first (10-30 KB); four GPUs of a 1e6-event capture, 2400 x 3120 px, need the last
STAND_IN_STEPS = ((1000, 32), (800, 16), (600, 8))
STAND_IN_BYTES = 48_000


def stand_in_png(png: bytes) -> bytes:
    """A PNG as a page embeds it where JavaScript is off: narrower and in a palette (a plot's few
    colours and their antialiasing), in STAND_IN_BYTES or the fewest it can; the file next to the
    page keeps every pixel."""
    from PIL import Image  # matplotlib's own dependency

    image = Image.open(io.BytesIO(png)).convert("RGB")
    for width, colors in STAND_IN_STEPS:
        small = image.resize((width, round(image.height * width / image.width)), Image.Resampling.LANCZOS) \
            if image.width > width else image
        buffer = io.BytesIO()
        small.quantize(colors=colors, method=Image.Quantize.MEDIANCUT).save(buffer, format="png", optimize=True)
        if buffer.tell() <= STAND_IN_BYTES:
            break
    return buffer.getvalue()


# -- timeline parts ----------------------------------------------------------------------------


# A capture of 200 GPUs made a 1200 x 78000 px image, one of 5,000 processes a legend no one can
# read and minutes of drawing: at most this many panels (the GPUs with the highest live bytes)
# and processes per panel (the largest there); the figure says what it left out.
MAX_PANELS = 8
MAX_PROCESSES_PER_PANEL = 8


def _bounded(panels: dict[int, list[Series]]) -> tuple[dict[int, list[Series]], str]:
    """At most MAX_PANELS panels of at most MAX_PROCESSES_PER_PANEL processes each, in their
    order; and the note saying what was left out ("" when nothing was)."""
    def highest(series: list[Series]) -> int:
        return max((max(s.live_bytes) for s in series if s.live_bytes), default=0)

    kept_keys = sorted(panels, key=lambda key: -highest(panels[key]))[:MAX_PANELS]
    kept: dict[int, list[Series]] = {}
    hidden_processes = 0
    for key in [key for key in panels if key in kept_keys]:
        by_pid: dict[int, list[Series]] = {}
        for s in panels[key]:
            by_pid.setdefault(s.pid, []).append(s)
        largest = set(sorted(by_pid, key=lambda pid: -highest(by_pid[pid]))[:MAX_PROCESSES_PER_PANEL])
        hidden_processes += len(by_pid) - len(largest)
        kept[key] = [s for s in panels[key] if s.pid in largest]
    hidden_panels = len(panels) - len(kept)
    parts = ([f"{hidden_panels} more GPUs"] if hidden_panels else []) + \
            ([f"{hidden_processes:,} more process series"] if hidden_processes else [])
    return kept, (f"Not drawn: {' and '.join(parts)} with lower memory (see analysis.json)" if parts else "")


def _window(analysis: Analysis, panels: dict[int, list[Series]], home: dict[int, int]) -> tuple[int, int]:
    """The time span worth drawing: where memory moves (`timeline.focus_*`, the span the page opens
    on), else from the first to the last memory event, band or failed call.

    Captures often spend seconds starting Python or NCCL before the first allocation; the whole
    capture on the x axis would squeeze the memory story into its last tenth.
    """
    timeline = analysis.timeline
    if timeline.focus_start_ns is not None and timeline.focus_end_ns is not None:
        return max(timeline.start_ns, timeline.focus_start_ns), min(timeline.end_ns, timeline.focus_end_ns)
    times = [t for series in panels.values() for s in series for t in (s.ts_ns[0], s.ts_ns[-1])]
    times += [t for b in timeline.bands if b.pid in home for t in (b.start_ns, b.end_ns)]
    times += [f.time_ns for f in analysis.failed_calls if f.pid in home]
    first, last = min(times), max(times)
    pad = 0.04 * (last - first) if last > first else 0.05 * max(timeline.end_ns - timeline.start_ns, 1)
    return max(timeline.start_ns, int(first - pad)), min(max(timeline.end_ns, last), int(last + pad))


def _draw_panel(ax, analysis: Analysis, gpu_key: int, series: list[Series], home_pids: list[int],
                window: tuple[int, int], t_scale: float) -> None:
    timeline = analysis.timeline
    drawn = {s.pid for s in series}
    peaks = [p for p in analysis.peaks if p.pid in drawn and p.gpu_or_device == gpu_key and p.peak_bytes > 0]
    failed = [f for f in analysis.failed_calls if f.pid in home_pids]
    top = max([max(s.live_bytes) for s in series] + [p.peak_bytes for p in peaks]
              + [_smi_top(analysis.smi, gpu_key, window)]
              + [f.live_bytes or 0 for f in failed] + [1])
    gpu = next((g for g in analysis.capture.gpus if g.id == gpu_key), None)
    total = gpu.total_memory_bytes if gpu else None
    draw_capacity = bool(total) and top >= CAPACITY_LINE_SHARE * total
    unit, scale = byte_unit(max(top, total or 0) if draw_capacity else top)
    names = {p.pid: p.name for p in analysis.capture.processes}
    several = len(drawn) > 1

    colors: dict[tuple[int, int], str] = {}
    for s in series:
        x = np.asarray(s.ts_ns, dtype=np.int64)
        y = np.asarray(s.live_bytes, dtype=np.int64)
        # Nothing is live before the first event; the last value holds to the end of the capture.
        if x[0] > timeline.start_ns:
            x, y = np.concatenate(([timeline.start_ns], x)), np.concatenate(([0], y))
        if x[-1] < timeline.end_ns:
            x, y = np.concatenate((x, [timeline.end_ns])), np.concatenate((y, [y[-1]]))
        label = f"{s.pid} {_short(names.get(s.pid, ''), 30)} · {s.kind}".replace("  ", " ")
        if s.device != gpu_key:
            label += f" (device {s.device})"
        (line,) = ax.plot(x / t_scale, y / scale, drawstyle="steps-post", linewidth=1.6,
                          linestyle=_KIND_STYLE.get(s.kind, "-"), label=_plain(label), zorder=3)
        line.set_gid(f"series:{s.pid}:{s.device}:{s.kind}")
        if s.kind in GPU_RESIDENT_KINDS:
            colors.setdefault((s.pid, s.device), line.get_color())

    placed: list[float] = []  # x of the callouts so far (axes fraction): a near one is raised a row
    for peak in sorted(peaks, key=lambda p: p.peak_time_ns):
        x, y = peak.peak_time_ns / t_scale, peak.peak_bytes / scale
        color = colors.get((peak.pid, peak.device), _PEAK_COLOR)
        ax.plot([x], [y], marker="v", markersize=8, color=color, markeredgecolor=_PEAK_COLOR, zorder=6,
                linestyle="none")
        text = f"peak {fmt_bytes(peak.peak_bytes)}" + (f" · {_short(peak.nvtx_range, 40)}" if peak.nvtx_range else "")
        if several:
            text = f"{peak.pid}: {text}"
        where = (peak.peak_time_ns - window[0]) / max(window[1] - window[0], 1)
        right_half = where > 0.6
        row = sum(1 for other in placed if abs(other - where) < 0.3)
        placed.append(where)
        ax.annotate(_plain(text), xy=(x, y), xytext=(-10 if right_half else 10, 9 + 16 * row),
                    textcoords="offset points", ha="right" if right_half else "left", va="bottom", fontsize=9,
                    zorder=7, gid=f"peak:{peak.pid}:{peak.device}",
                    bbox={"boxstyle": "round,pad=0.25", "facecolor": "white", "edgecolor": color, "alpha": 0.9},
                    arrowprops={"arrowstyle": "-", "color": color, "linewidth": 0.8})

    if draw_capacity:
        line = ax.axhline(total / scale, color="#555555", linestyle="--", linewidth=1.2, zorder=2,
                          label=f"GPU memory {fmt_bytes(total)}")
        line.set_gid("capacity")

    bands = [b for b in timeline.bands if b.pid in home_pids]
    for i, band in enumerate(bands):
        patch = ax.axvspan(band.start_ns / t_scale, band.end_ns / t_scale, color=_BAND_SHADES[i % 2], zorder=0,
                           linewidth=0)
        patch.set_gid("band")
    _label_bands(ax, bands, window, t_scale)

    if failed:
        xs = np.array([f.time_ns for f in failed], dtype=float) / t_scale
        ys = np.array([f.live_bytes or 0 for f in failed], dtype=float) / scale
        errors = sorted({f.error for f in failed})
        marks = ax.scatter(xs, ys, marker="X", s=70, color=_FAILED_COLOR, edgecolors="white", linewidths=0.6,
                           zorder=8, label=_plain(f"failed call ({len(failed)}): {_short(', '.join(errors), 50)}"))
        marks.set_gid("failed")

    _draw_smi(ax, analysis.smi, gpu_key, t_scale, scale)
    handles, _ = ax.get_legend_handles_labels()
    if bands:
        who = ", ".join(str(p) for p in home_pids if any(b.pid == p for b in bands))
        handles.append(Patch(color=_BAND_SHADES[0], label=f"NVTX ranges (process {who})"))
    ax.legend(handles=handles, loc="best", fontsize=8, framealpha=0.9)
    # Headroom for the callouts: a second row when several peaks share the panel.
    ax.set_ylim(0, max(top, total if draw_capacity else 0) / scale * (1.2 if len(peaks) < 2 else 1.45))
    ax.set_ylabel(f"live memory ({unit})")
    ax.grid(alpha=0.3, zorder=0)
    ax.set_title(_plain(_panel_title(analysis, gpu_key, gpu, draw_capacity, peaks)), loc="left", fontsize=11,
                 pad=22 if bands else 6)  # room for the two rows of band labels above the plot


def _label_bands(ax, bands: list, window: tuple[int, int], t_scale: float) -> None:
    """Band names in a strip of two rows above the plot, each starting at its band: a label goes
    to the first row where it overlaps no other label, and is left out when neither has room.
    Labels never overlap one another, and no callout (inside the plot) can sit on them."""
    # The plot's width in points: the figure less the y axis (ticks and label) and the margins.
    width_pt = (ax.figure.get_figwidth() - 0.9) * 72
    span = max(window[1] - window[0], 1)
    char_pt = 7 * 0.56  # a 7 pt DejaVu Sans character is about 3.9 pt wide on average
    taken: list[list[tuple[float, float]]] = [[], []]  # per row, the spans of its labels (points)
    labelled = 0
    # The longest bands choose first (the steps before the short library ranges between them).
    for band in sorted(bands, key=lambda b: (-(b.end_ns - b.start_ns), b.start_ns)):
        if labelled >= MAX_BAND_LABELS or band.end_ns <= window[0] or band.start_ns >= window[1]:
            continue
        name = _short(band.name, 24)
        left = (max(band.start_ns, window[0]) - window[0]) / span * width_pt
        right = left + 3 + len(name) * char_pt
        row = next((i for i, spans in enumerate(taken)
                    if all(right + 4 < l or left > r + 4 for l, r in spans)), None)
        if row is None or right > width_pt + 20:
            continue
        taken[row].append((left, right))
        ax.annotate(_plain(name), xy=(max(band.start_ns, window[0]) / t_scale, 1), xycoords=ax.get_xaxis_transform(),
                    xytext=(1.5, 2 + 9 * row), textcoords="offset points", va="bottom", ha="left", fontsize=7,
                    color="#444444", annotation_clip=False, zorder=1, gid="band-label")
        labelled += 1


def _smi_top(smi: Optional[SmiOverlay], gpu: int, window: tuple[int, int]) -> int:
    """The highest nvidia-smi value inside the drawn window, so that the panel's y axis holds it."""
    top = 0
    for s in smi_series(smi, gpu):
        ts, used = np.asarray(s.ts_ns), np.asarray(s.used_bytes)
        inside = (ts >= window[0]) & (ts <= window[1])
        if inside.any():
            top = max(top, int(used[inside].max()))
    return top


def _draw_smi(ax, smi: Optional[SmiOverlay], gpu: int, t_scale: float, scale: float) -> None:
    """Each log's samples of this GPU as steps with a dot per sample."""
    for i, s in enumerate(smi_series(smi, gpu)):
        who = "memory.used" if s.pid is None else f"process {s.pid} used_memory"
        (line,) = ax.plot(np.asarray(s.ts_ns) / t_scale, np.asarray(s.used_bytes) / scale, drawstyle="steps-post",
                          linewidth=0.9, marker=_SMI_MARKERS[i % len(_SMI_MARKERS)], markersize=2.5,
                          color=_SMI_COLORS[i % len(_SMI_COLORS)], alpha=0.85, zorder=4,
                          label=_plain(f"nvidia-smi {who} ({s.log})"))
        line.set_gid(f"smi:{s.log}:{s.gpu}:{'all' if s.pid is None else s.pid}")


def _panel_title(analysis: Analysis, gpu_key: int, gpu: Optional[Gpu], draw_capacity: bool,
                 peaks: list[Peak]) -> str:
    title = f"GPU {gpu_key}"
    if gpu is not None:
        title += f" · {_short(gpu.name, 40)}"
        if gpu.total_memory_bytes and not draw_capacity:
            title += f" · {fmt_bytes(gpu.total_memory_bytes)}"
            if peaks:  # the line itself would squash the curves flat: the capacity is stated instead
                title += f" (highest peak: {max(p.peak_bytes for p in peaks) / gpu.total_memory_bytes:.1%} of it)"
    shared = analysis.gpu_peaks().get(gpu_key)
    if shared is not None and shared.pid is None:
        title += f" · all processes: peak {fmt_bytes(shared.peak_bytes)} at {fmt_time(shared.peak_time_ns)}"
    return title


# -- helpers -----------------------------------------------------------------------------------


@contextlib.contextmanager
def matplotlib_defaults() -> Iterator[None]:
    """Matplotlib's default style for the duration, whatever the user's matplotlibrc says."""
    with matplotlib.rc_context():
        matplotlib.rcdefaults()
        yield


def byte_unit(max_bytes: float) -> tuple[str, int]:
    """The largest binary unit the value reaches: ("GiB", 2**30) for 5.3 GiB, ("MiB", 2**20) for 908 MiB."""
    return next(((unit, size) for unit, size in _BYTE_UNITS if max_bytes >= size), ("B", 1))


def _short(text: str, limit: int) -> str:
    text = " ".join(str(text).split())  # newlines and tabs from a profile would break the layout
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _plain(text: str) -> str:
    """Text drawn as is: an unescaped `$` would start mathtext (and a bad formula fails to draw)."""
    return text.replace("$", r"\$")
