"""compare.png: the base and the new run's live bytes on one axis per matched process and GPU.

Each run's curve is its GPU-resident kinds (device + array + static) summed, drawn from the
downsampled series of its `Analysis.timeline`. The two runs' clocks differ, so each is drawn from
its own origin: the start of its first step (the analysis's steps, else an NVTX range named
"step …") when both have steps, else its first memory event.
"""

from __future__ import annotations

import re
from typing import Optional

import numpy as np
from matplotlib.figure import Figure

from ..model.comparison import Comparison
from ..errors import printable
from ..model import GPU_RESIDENT_KINDS, Analysis
from ..base.units import fmt_bytes
from .png import byte_unit, matplotlib_defaults

_STEP = re.compile(r"^\s*(?:train(?:ing)?[ _-]?)?step\b", re.IGNORECASE)
_BASE_COLOR, _NEW_COLOR = "#7f7f7f", "#d62728"


def plot_comparison(c: Comparison, base: Analysis, new: Analysis, limit: int = 8) -> Figure:
    """One panel per matched (process, GPU), base in grey, new in red; x in seconds from each
    run's origin, y in the largest binary unit the panel reaches."""
    rows = c.with_memory[:limit]
    with matplotlib_defaults():
        if not rows:
            fig = Figure(figsize=(12, 1.2), dpi=100)
            fig.text(0.5, 0.5, "No memory timeline in either run", ha="center", va="center", fontsize=12)
            return fig
        fig = Figure(figsize=(12, 3.4 * len(rows)), dpi=100, layout="constrained")
        axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
        for ax, row in zip(axes, rows):
            curves = [(label, color, _curve(run, pid, gpu))
                      for label, color, run, pid, gpu in (("base " + c.base.name, _BASE_COLOR, base, row.base_pid,
                                                           row.base_gpu),
                                                          ("new " + c.new.name, _NEW_COLOR, new, row.new_pid,
                                                           row.new_gpu))]
            aligned_on_steps = all(curve is not None and curve[2] for _, _, curve in curves)
            top = max((float(curve[1].max()) for _, _, curve in curves if curve is not None and len(curve[1])),
                      default=1.0)
            unit, scale = byte_unit(top)
            for label, color, curve in curves:
                if curve is None:
                    continue
                ts, live, step_origin = curve
                origin = step_origin if aligned_on_steps else (ts[0] if len(ts) else 0)
                ax.step((ts - origin) / 1e9, live / scale, where="post", color=color, label=_plain(label),
                        gid=f"compare:{'base' if color == _BASE_COLOR else 'new'}")
            ax.set_title(_plain(f"{row.role}: peak {fmt_bytes(row.peak.before)} → {fmt_bytes(row.peak.after)}"),
                         loc="left", fontsize=10)
            ax.set_ylabel(unit)
            ax.set_xlabel("s from the first step" if aligned_on_steps else "s from the first memory event")
            ax.grid(True, alpha=0.3)
            ax.legend(loc="upper left", fontsize=8)
        return fig


def _curve(run: Analysis, pid: Optional[int], gpu: Optional[int]):
    """(times ns, live GPU-resident bytes, the first step's start or 0) of one process on one GPU."""
    if pid is None:
        return None
    devices = run.devices_on_gpu(pid, gpu)
    series = [s for s in run.timeline.series
              if s.pid == pid and s.device in devices and s.kind in GPU_RESIDENT_KINDS and s.ts_ns]
    if not series:
        return None
    ts = np.unique(np.concatenate([np.asarray(s.ts_ns, dtype=np.int64) for s in series]))
    live = np.zeros(len(ts), dtype=np.float64)
    for s in series:
        at = np.searchsorted(np.asarray(s.ts_ns, dtype=np.int64), ts, side="right") - 1
        values = np.asarray(s.live_bytes, dtype=np.float64)
        live += np.where(at >= 0, values[np.clip(at, 0, None)], 0.0)
    # The steps the analysis found (issue 17's step series), else NVTX bands named like a step.
    steps = [series.steps[0].start_ns for series in getattr(run, "steps", None) or []
             if series.pid == pid and series.device in devices and series.steps]
    if not steps:
        steps = [b.start_ns for b in run.timeline.bands if b.pid == pid and _STEP.match(b.name)]
    return ts, live, min(steps) if steps else 0


def _plain(text: str) -> str:
    return printable(text).replace("$", r"\$")
