"""How the lists describe the allocations they show (never freed, largest, live at a peak or at an
out-of-memory moment), one way on both paths (`Listed`, to_allocations), and the free times of
those a flow of batches lists (FreeTimes)."""

from __future__ import annotations

from functools import partial
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..engine import Reducer, TotalMemory
from ..events.batch import EventBatch
from ..events.load import QUICK_API
from ..model import Allocation, Peak
from .explore import LargestAllocations
from .peak import LIVE_AT_PEAK, Peaks, PeakSeries, module_load_note, peak_of
from .sites import call_site


def to_allocations(rows: pd.DataFrame, free_ns: np.ndarray, site_table: dict[str, dict]) -> list[Allocation]:
    """Allocation records for `rows` (alloc rows of an events frame), freed at `free_ns` (-1: not freed)."""
    if rows.empty:
        return []
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
        in zip(*(rows[c].tolist() for c in columns), np.asarray(free_ns).tolist())  # capped lists only
    ]


class Listed:
    """The listed allocations (batch_rows' frames: their `seq`) as rows of an events frame
    (`rows`), made Allocations by to_allocations (`allocations`): here the whole frame's own rows,
    freed as its pairing says; a flow's rows are made of what its second look kept (flow.Described)."""

    def __init__(self, events: pd.DataFrame, site_table: dict[str, dict]) -> None:
        self.events, self.site_table = events, site_table

    def rows(self, listed: pd.DataFrame, peak=None) -> tuple[pd.DataFrame, np.ndarray]:
        """An events frame, and the positions in it of the `listed` allocations (those live at
        `peak`, a PeakSeries or oom.Moment, when given), in their order."""
        return self.events, _seqs(listed)

    def free_times(self, listed: pd.DataFrame, free_ts: dict[int, int]) -> np.ndarray:
        """When each of the `listed` allocations was freed (-1: never): `free_ts`, seq -> free
        time, is a flow's; the whole frame's partner column knows every one."""
        partner = self.events["partner"].to_numpy()[_seqs(listed)] if len(listed) else np.zeros(0, "int64")
        return np.where(partner >= 0, self.events["ts_ns"].to_numpy()[np.maximum(partner, 0)], -1)

    def peak_event(self, peak: PeakSeries) -> Optional[tuple[str, str]]:
        """The API name and NVTX range of the event at which `peak` was reached (None: unknown)."""
        return str(self.events["api"].iat[peak.best_seq]), str(self.events["nvtx_range"].iat[peak.best_seq])

    def own_api(self, peak: PeakSeries) -> Optional[str]:
        """The API of the last allocation of `peak`'s own (not a module static) before it (None: unknown)."""
        return str(self.events["api"].iat[peak.note_own_seq]) if peak.note_own_seq >= 0 else None

    def frame(self, listed: pd.DataFrame, peak=None) -> pd.DataFrame:
        frame, at = self.rows(listed, peak)
        return frame.iloc[at]

    def allocations(self, listed: pd.DataFrame, free_ts: Optional[dict[int, int]] = None,
                    peak=None) -> list[Allocation]:
        return to_allocations(self.frame(listed, peak), self.free_times(listed, free_ts or {}), self.site_table)


def _seqs(listed: pd.DataFrame) -> np.ndarray:
    return listed["seq"].to_numpy() if len(listed) else np.zeros(0, "int64")


def described_peaks(series: list[PeakSeries], kinds: list[str], total_memory: TotalMemory, listed: Listed,
                    free_ts: Optional[dict[int, int]] = None) -> tuple[list[Peak], list[Callable[[], str]]]:
    """The Peak of each series that reached one (peak.Peaks' answer), its live set as `listed`
    describes it, and what a module load that reached it stood on (peak.module_load_note)."""
    peaks, notes = [], []
    for s in (s for s in series if s.best_seq >= 0):
        frame, at = listed.rows(s.live_set, s)
        event = listed.peak_event(s) or ("(module load)" if kinds[s.best_kind] == "static" else QUICK_API, "")
        peaks.append(peak_of(s, frame, at, event, total_memory(s.gpu),
                             lambda largest, s=s: listed.allocations(s.live_set.iloc[largest], free_ts, s),
                             listed.site_table))
        notes.append(partial(module_load_note, s, listed.own_api(s)))
    return peaks, notes


class FreeTimes(Reducer):
    """The free times of the allocations that the lists show with their lifetimes, by seq: the
    largest (`largest`'s answer after the first look), the LIVE_AT_PEAK largest live at each
    peak (`peaks`' series, raised on the second look: this looks at a batch after the peaks, as a
    peak's live set may be freed later in the batch that raised it) and the largest live at each
    moment of out of memory (`live_sets`, oom.OomLiveSets: resolved on the second look, looked at
    after it alike). The whole frame reads them from its partner column instead
    (Listed.free_times): its pairing is this answer for every row."""

    field = "free_times"
    second_look = True

    def __init__(self, largest: LargestAllocations, peaks: Peaks, live_sets=None) -> None:
        self.largest, self.peaks, self.live_sets = largest, peaks, live_sets
        self.needs = ("largest", "peaks") + (("oom_live",) if live_sets is not None else ())

    def add(self, b: EventBatch) -> None:
        pass

    def between(self) -> None:
        self.wanted = set(self.largest.finish({})[0]["seq"].tolist())
        self.free_ts: dict[int, int] = {}  # allocation seq -> its free's time
        self.seen: dict[int, object] = {}  # id of a series -> the live set whose largest are wanted
        self.resolved: set[int] = set()  # ids of the out-of-memory moments whose largest are wanted
        self.sorted = np.zeros(0, "int64")  # `wanted` in order, made again when it grows

    def again(self, b: EventBatch) -> None:
        for peak in self.peaks.series:
            if peak.best_seq >= 0 and self.seen.get(id(peak)) is not peak.live_set:
                self.seen[id(peak)] = peak.live_set
                self.wanted |= set(_listed_live(peak))
        for moment in self._moments():
            if id(moment) not in self.resolved:
                self.resolved.add(id(moment))
                self.wanted |= set(moment.largest["seq"].tolist())
        frees = np.flatnonzero(b.partner_seq >= 0)
        if self.wanted and len(frees):
            if len(self.sorted) != len(self.wanted):  # (it only grows)
                self.sorted = np.sort(np.fromiter(self.wanted, "int64"))
            # a search among the few wanted for each free (an isin sorted both, every batch)
            partners = b.partner_seq[frees]
            hit = frees[self.sorted[np.minimum(np.searchsorted(self.sorted, partners), len(self.sorted) - 1)]
                        == partners]
            self.free_ts.update(zip(b.partner_seq[hit].tolist(), b.ts[hit].tolist()))

    def finish(self, live: dict) -> dict[int, int]:
        """The free times of the allocations listed in the end (not those live at a peak that a
        later batch raised higher)."""
        listed = set(self.largest.finish({})[0]["seq"].tolist())
        for peak in self.peaks.series:
            listed |= set(_listed_live(peak)) if peak.best_seq >= 0 else set()
        for moment in self._moments():
            listed |= set(moment.largest["seq"].tolist())
        return {seq: ts for seq, ts in self.free_ts.items() if seq in listed}

    def _moments(self) -> list:
        """The out-of-memory moments whose live sets are found so far."""
        return [m for m in self.live_sets.moments if m.resolved] if self.live_sets is not None else []


def _listed_live(peak) -> list[int]:
    """The seqs of the LIVE_AT_PEAK largest allocations live at a peak (PeakSeries), as peak_of lists them."""
    return peak.live_set.sort_values("bytes", ascending=False, kind="stable")["seq"].head(LIVE_AT_PEAK).tolist()
