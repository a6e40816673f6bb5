"""What the bytes are in the streamed full analysis (streamed_full.py): byte_classes' reducers fed
batch by batch. The first pass hands Heights each (process, device) series' running live bytes
(FirstLook's spike series: device + array, as the step tables); the second, as a watcher of
streamed_sites.SiteSums, hands Lifetimes each free with its allocation's time (from the batch or
the live set before it) and each allocation that can never be freed; the allocations still live
at the end come last. Only the live set (already carried) and per-moment sums are held.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from .byte_classes import HIGH, Heights, Lifetimes, step_phases
from .streamed import SPIKE_KINDS, FirstLook
from .streamed_allocators import OUTSIDE, AllocatorRows


class FirstHeights:
    """The first pass's consumer (after FirstLook has summed the batch)."""

    def __init__(self, look: FirstLook, found: dict, ranges: pd.DataFrame) -> None:
        self.look = look
        self.heights = Heights(step_phases(found, ranges))
        self.pairs: dict[int, tuple[int, int]] = {}  # spike series code -> (pid, device)

    def add(self, b) -> None:
        got = self.look.batch_live.get("spikes")
        if got is None or not self.heights.phases:
            return
        rows, codes, live = got
        for code in pd.unique(codes).tolist():  # a few series
            if code not in self.pairs:
                key = next(k for k, c in self.look.spike_series.index.items() if c == code)
                device = key & 0xFFFF
                self.pairs[code] = (key >> 16, device - 0x10000 if device & 0x8000 else device)
            pid, device = self.pairs[code]
            mine = codes == code
            self.heights.add(pid, device, b.seq[rows[mine]], b.ts[rows[mine]], live[mine])


class SecondLifetimes:
    """The second pass's watcher: each allocation once, at its free or when it can never be freed;
    which live ones are outside a caching allocator (streamed_allocators.AllocatorRows, as the
    allocators are judged) is carried until then."""

    def __init__(self, heights: Heights, api_names: list[str]) -> None:
        self.lifetimes = Lifetimes(heights)
        self.judged = AllocatorRows(api_names)
        self.outside = np.zeros(0, "int64")  # seqs of the live allocations outside, sorted

    def add(self, b, known=None) -> None:
        if not self.lifetimes.heights.best or len(b) == 0:
            return
        rows, _, bits = self.judged.of(b)
        self.outside = np.union1d(self.outside, b.seq[rows[(bits & OUTSIDE) != 0]])
        frees = np.flatnonzero(~b.is_alloc & (b.partner_seq >= 0) & np.isin(b.kind, SPIKE_KINDS))
        if len(frees):
            before = b.live_before
            allocs = np.flatnonzero(b.is_alloc)
            seqs = np.concatenate([np.asarray(before.get("seq", []), "int64"), b.seq[allocs]])
            times = np.concatenate([np.asarray(before.get("ts", []), "int64"), b.ts[allocs]])
            order = np.argsort(seqs, kind="stable")
            at = order[np.searchsorted(seqs[order], b.partner_seq[frees])]
            self._add(b.pid[frees], b.device[frees], b.partner_seq[frees], times[at], b.seq[frees], b.ts[frees],
                      b.bytes[frees])
        closed = b.closed
        if len(closed.get("seq", [])):
            self.never_freed(closed)

    def never_freed(self, rows: dict) -> None:
        """Allocations (the flow's _LIVE columns) that are never freed in the capture."""
        kind = np.asarray(rows["kind"])
        chosen = np.flatnonzero(np.isin(kind, SPIKE_KINDS))
        if not len(chosen):
            return
        seq = np.asarray(rows["seq"], "int64")[chosen]
        high = np.full(len(chosen), HIGH, "int64")
        self._add(np.asarray(rows["pid"])[chosen], np.asarray(rows["device"])[chosen], seq,
                  np.asarray(rows["ts"], "int64")[chosen], high, high, np.asarray(rows["bytes"], "int64")[chosen])

    def _add(self, pid, device, a_seq, a_ts, f_seq, f_ts, size) -> None:
        outside = np.isin(a_seq, self.outside)
        if outside.any():  # classed now: no longer carried
            self.outside = np.setdiff1d(self.outside, a_seq[outside], assume_unique=True)
        pairs = pd.DataFrame({"pid": pid, "device": device}).drop_duplicates()
        for p, d in zip(pairs["pid"].tolist(), pairs["device"].tolist()):  # a few series
            mine = (pid == p) & (device == d)
            self.lifetimes.add(int(p), int(d), a_seq[mine], a_ts[mine], f_seq[mine], f_ts[mine],
                               np.asarray(size)[mine].astype("int64"), outside[mine])

    def finish(self, live: dict) -> Optional[Lifetimes]:
        """The lifetimes, once the allocations still live at the end (EventFlow.live) are added."""
        if len(live.get("seq", [])):
            self.never_freed(live)
        return self.lifetimes if self.lifetimes.sums else None
