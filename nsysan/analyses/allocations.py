"""Turn alloc rows of the events frame into `Allocation` records (only for short, capped lists),
and the free times of those a flow of batches lists (FreeTimes)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..engine import Reducer
from ..events.batch import EventBatch
from ..model import Allocation
from .explore import LargestAllocations
from .peak import LIVE_AT_PEAK, Peaks
from .sites import call_site


def to_allocations(rows: pd.DataFrame, events: pd.DataFrame, site_table: dict[str, dict]) -> list[Allocation]:
    """Allocation records for `rows` (alloc events); the free time comes from the partner row."""
    if rows.empty:
        return []
    partner = rows["partner"].to_numpy()
    all_ts = events["ts_ns"].to_numpy()
    free_ts = np.where(partner >= 0, all_ts[np.maximum(partner, 0)], -1)
    columns = ["pid", "tid", "device", "kind", "api", "address", "bytes", "ts_ns", "nvtx_range", "site", "stack",
               "operator"]
    return [
        Allocation(pid=int(pid), tid=int(tid), device=int(device), kind=str(kind), api=str(api),
                   address=int(address), bytes=int(size), alloc_time_ns=int(ts),
                   free_time_ns=int(freed) if freed >= 0 else None, nvtx_range=str(nvtx),
                   site=call_site(str(site), site_table), stack_id=int(stack) if stack >= 0 else None,
                   operator=str(operator))
        for pid, tid, device, kind, api, address, size, ts, nvtx, site, stack, operator, freed
        # columns as lists, not itertuples: this runs for each of thousands of processes' peaks
        in zip(*(rows[c].tolist() for c in columns), free_ts.tolist())  # capped lists only
    ]


class FreeTimes(Reducer):
    """The free times of the allocations that the lists show with their lifetimes, by seq: the
    largest (`largest`'s answer after the first look) and the LIVE_AT_PEAK largest live at each
    peak (`peaks`' series, raised on the second look: this looks at a batch after the peaks, as a
    peak's live set may be freed later in the batch that raised it). The whole frame reads them
    from its partner column instead (to_allocations): its pairing is this answer for every row."""

    field = "free_times"
    needs = ("largest", "peaks")
    second_look = True

    def __init__(self, largest: LargestAllocations, peaks: Peaks) -> None:
        self.largest, self.peaks = largest, peaks

    def add(self, b: EventBatch) -> None:
        pass

    def between(self) -> None:
        self.wanted = set(self.largest.finish({})[0]["seq"].tolist())
        self.free_ts: dict[int, int] = {}  # allocation seq -> its free's time
        self.seen: dict[int, object] = {}  # id of a series -> the live set whose largest are wanted

    def again(self, b: EventBatch) -> None:
        for peak in self.peaks.series:
            if peak.best_seq >= 0 and self.seen.get(id(peak)) is not peak.live_set:
                self.seen[id(peak)] = peak.live_set
                self.wanted |= set(_listed_live(peak))
        frees = np.flatnonzero(b.partner_seq >= 0)
        if self.wanted and len(frees):
            hit = frees[np.isin(b.partner_seq[frees], np.fromiter(self.wanted, "int64"))]
            self.free_ts.update(zip(b.partner_seq[hit].tolist(), b.ts[hit].tolist()))

    def finish(self, live: dict) -> dict[int, int]:
        """The free times of the allocations listed in the end (not those live at a peak that a
        later batch raised higher)."""
        listed = set(self.largest.finish({})[0]["seq"].tolist())
        for peak in self.peaks.series:
            listed |= set(_listed_live(peak)) if peak.best_seq >= 0 else set()
        return {seq: ts for seq, ts in self.free_ts.items() if seq in listed}


def _listed_live(peak) -> list[int]:
    """The seqs of the LIVE_AT_PEAK largest allocations live at a peak (PeakSeries), as peak_of lists them."""
    return peak.live_set.sort_values("bytes", ascending=False, kind="stable")["seq"].head(LIVE_AT_PEAK).tolist()
