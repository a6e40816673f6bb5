"""nvidia-smi samples on the PNG timeline's GPU panels (`analysis.smi.series`).

Each log's samples are drawn as a thin step line with a dot per sample, over the trace's exact
live bytes: the gap between them is what no allocation shows, the dots show how coarse the
sampling was. Artists carry gids "smi:<log>:<gpu>:<pid or all>".
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..model.smi import SmiOverlay, SmiSeries

_MARKERS = ("o", "s", "^", "D")
_COLORS = ("#7f7f7f", "#bcbd22", "#17becf", "#8c564b")


def series_on(smi: Optional[SmiOverlay], gpu: int) -> list[SmiSeries]:
    """The nvidia-smi series of one GPU panel."""
    return [s for s in smi.series if s.gpu == gpu and s.ts_ns] if smi is not None else []


def smi_top(smi: Optional[SmiOverlay], gpu: int, window: tuple[int, int]) -> int:
    """The highest nvidia-smi value inside the drawn window, so that the panel's y axis holds it."""
    top = 0
    for s in series_on(smi, gpu):
        ts, used = np.asarray(s.ts_ns), np.asarray(s.used_bytes)
        inside = (ts >= window[0]) & (ts <= window[1])
        if inside.any():
            top = max(top, int(used[inside].max()))
    return top


def draw_smi(ax, smi: Optional[SmiOverlay], gpu: int, t_scale: float, scale: float) -> None:
    """Each log's samples of this GPU as steps with a dot per sample."""
    for i, s in enumerate(series_on(smi, gpu)):
        who = "memory.used" if s.pid is None else f"process {s.pid} used_memory"
        label = f"nvidia-smi {who} ({s.log})".replace("$", r"\$")
        (line,) = ax.plot(np.asarray(s.ts_ns) / t_scale, np.asarray(s.used_bytes) / scale, drawstyle="steps-post",
                          linewidth=0.9, marker=_MARKERS[i % len(_MARKERS)], markersize=2.5,
                          color=_COLORS[i % len(_COLORS)], alpha=0.85, zorder=4, label=label)
        line.set_gid(f"smi:{s.log}:{s.gpu}:{'all' if s.pid is None else s.pid}")
