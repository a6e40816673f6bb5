"""compare.png: the base and the new run's live bytes on one axis per matched process and GPU.

Each run's curve is its GPU-resident kinds (device + array + static) summed, drawn from the
downsampled series of its `Analysis.timeline`. The two runs' clocks differ, so each is drawn from
its own origin: the start of its first step (the analysis's steps, else an NVTX range named
"step …") when both have steps, else its first memory event.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from ..model.comparison import Comparison
from ..errors import printable
from ..model import Analysis
from ..base.units import fmt_bytes
from .png import byte_unit, matplotlib_defaults

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
            curves = [(label, color, run.resident_curve(pid, gpu))
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


def _plain(text: str) -> str:
    return printable(text).replace("$", r"\$")
