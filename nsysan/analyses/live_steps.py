"""The exact live-bytes timeline of some processes on one GPU, as a step function to query.

nvidia-smi samples are compared with it at their own instants; the step function answers "how
much was live at t", "the highest value in a window" and "how long was it above a level".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import numpy as np
import pandas as pd

from ..events.arrays import distinct_pairs, pair_of
from ..model import GPU_RESIDENT_KINDS


@dataclass(frozen=True)
class LiveSteps:
    """Live GPU-resident bytes after each event (events in time order); 0 before the first."""

    ts_ns: np.ndarray  # int64, sorted
    live_bytes: np.ndarray  # int64, live right after the event at the same position

    def at(self, times_ns: np.ndarray) -> np.ndarray:
        """Live bytes at each instant (every event at or before it counted)."""
        idx = np.searchsorted(self.ts_ns, np.asarray(times_ns, dtype="int64"), side="right") - 1
        return np.where(idx >= 0, self.live_bytes[np.maximum(idx, 0)], 0) if len(self.ts_ns) else \
            np.zeros(len(np.atleast_1d(times_ns)), "int64")

    def peak_in(self, start_ns: int, end_ns: int) -> tuple[int, int]:
        """The highest live bytes in [start, end] and the first time it was reached."""
        best, when = int(self.at(np.array([start_ns]))[0]), start_ns
        lo, hi = np.searchsorted(self.ts_ns, [start_ns, end_ns], side="right")
        if hi > lo:
            i = lo + int(np.argmax(self.live_bytes[lo:hi]))
            if self.live_bytes[i] > best:
                best, when = int(self.live_bytes[i]), int(self.ts_ns[i])
        return best, when

    def time_above(self, level: int, start_ns: int, end_ns: int) -> tuple[int, int, int]:
        """(total ns above `level`, separate excursions above it, the longest) within [start, end]."""
        lo, hi = np.searchsorted(self.ts_ns, [start_ns, end_ns], side="right")
        # The steps inside the window: the value carried in at its start, then each event's.
        begins = np.concatenate([[start_ns], self.ts_ns[lo:hi]])
        values = np.concatenate([self.at(np.array([start_ns])), self.live_bytes[lo:hi]])
        ends = np.concatenate([begins[1:], [end_ns]])
        above = values > level
        if not above.any():
            return 0, 0, 0
        lengths = (ends - begins)[above]
        # An excursion is a run of consecutive steps above the level; several events at one
        # instant make zero-length steps that do not split it.
        run_id = np.cumsum(np.concatenate([[True], ~above[:-1]]))[above]
        per_run = pd.Series(lengths).groupby(run_id).sum()
        return int(lengths.sum()), int(len(per_run)), int(per_run.max())


def live_steps(events: pd.DataFrame, pids: Iterable[int], gpu: Optional[int],
               gpu_of: Callable[[int, int], Optional[int]]) -> LiveSteps:
    """The live GPU-resident bytes of `pids` together on `gpu` (device + array + static)."""
    wanted = set(int(p) for p in pids)
    resident = events["kind"].isin(GPU_RESIDENT_KINDS).to_numpy() & events["pid"].isin(wanted).to_numpy()
    pid = events["pid"].to_numpy()[resident]
    device = events["device"].to_numpy()[resident]
    on_gpu = np.ones(len(pid), dtype=bool)
    if gpu is not None and len(pid):
        pairs = distinct_pairs(pid, device, 16, 0xFFFF).tolist()  # pair_key's
        keep = [p for p in pairs if gpu_of(*pair_of(p)) == gpu]
        on_gpu = np.isin((pid.astype("int64") << 16) | (device.astype("int64") & 0xFFFF), keep)
    ts = events["ts_ns"].to_numpy()[resident][on_gpu].astype("int64")
    live = np.cumsum(events["delta_bytes"].to_numpy()[resident][on_gpu].astype("int64"))
    return LiveSteps(ts, live)
