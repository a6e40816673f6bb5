"""The second look at the flow of event batches (`--quick` streamed, in bounded memory).

Knowing the first look's totals (streamed.py: every group's span, the largest allocations), this
pass has the pools and the peaks (peak.Peaks) look at each batch first, so that the sites' look
after it reads the live set of a peak raised in that batch, and fills in what lies after a moment
(the free times of listed allocations, those live at the peaks among them). analyses.md says what
is exact (all of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from ..events.stream import EventBatch
from .peak import LIVE_AT_PEAK, Peaks, PeakSeries
from .streamed import FirstLook


@dataclass
class SecondLook:
    """The pass that needs the first look's totals (see the module's docstring)."""

    first: FirstLook
    peak_look: Peaks  # its second look at a batch, before the sites' (which read the live sets it keeps)
    free_ts: dict = field(default_factory=dict)  # allocation seq -> its free's time, for listed ones
    wanted: set = field(default_factory=set)
    # pools.PoolUses: its second look at a batch queues the pools' reserve changes in `changes`, which
    # the peaks take before the engine's turn (their again() then does nothing more)
    pools: Optional[Any] = None
    seen: dict = field(default_factory=dict)  # id of a series -> the live set whose largest are wanted

    def __post_init__(self) -> None:
        self.wanted = set(self.first.largest["seq"].tolist()) if not self.first.largest.empty else set()

    @property
    def peaks(self) -> list[PeakSeries]:
        return self.peak_look.series

    def add(self, b: EventBatch) -> None:
        if self.pools is not None:
            self.pools.again(b)
        self.peak_look.again(b)
        if len(b) == 0:
            return
        for peak in self.peaks:  # before the free times: a peak's live set may be freed later in this batch
            if peak.best_seq >= 0 and self.seen.get(id(peak)) is not peak.live_set:
                self.seen[id(peak)] = peak.live_set
                self.wanted |= set(peak.live_set.sort_values("bytes", ascending=False, kind="stable")
                                   ["seq"].head(LIVE_AT_PEAK).tolist())
        frees = np.flatnonzero(b.partner_seq >= 0)
        if self.wanted and len(frees):
            hit = np.isin(b.partner_seq[frees], np.fromiter(self.wanted, "int64"))
            for alloc, ts in zip(b.partner_seq[frees[hit]].tolist(), b.ts[frees[hit]].tolist()):
                self.free_ts[alloc] = ts

