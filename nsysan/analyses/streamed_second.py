"""The second look at the flow of event batches (`--quick` streamed, in bounded memory).

Knowing the first look's totals (streamed.py: every group's span, the largest allocations) and the
pools' reserve, this pass finds each peak with the live set at that moment (kept at the highest
point of each batch that beats the peak so far) and fills in what lies after a moment (the free
times of listed allocations). analyses.md says what is exact (all of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pandas as pd

from ..events.stream import EventBatch
from .peak import LIVE_AT_PEAK
from .pools import reached_before
from .streamed import LOW, RESIDENT, STATIC, FirstLook, _rows, pair_key


@dataclass
class PeakSeries:
    """GPU-resident live bytes (and pools' unused reserve) of one (process, device), or of every
    process on one GPU (pid None), with the live set kept at its highest point so far."""

    pid: Optional[int]
    device: int
    gpu: Optional[int]
    members: np.ndarray  # pair keys
    live: int = 0
    reserve: int = 0
    best: int = LOW
    best_seq: int = -1
    best_ts: int = 0
    best_kind: int = 0
    best_reserve: int = 0
    reached_ts: int = 0  # when the best level was first reached: best_ts, or a pool's creation before it
    live_set: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the last allocation not of module statics, and the statics' bytes since (peak notes)
    own_ts: Optional[int] = None
    statics_since: int = 0
    note_own_ts: Optional[int] = None
    note_statics: int = 0


def _reached(at: int, attached: list, increment: int, ts: int) -> int:
    """peak._reached for the row `at` of a batch's series: the earliest of the pool changes
    attached to it (`attached`: (rows, times, bytes) per member) by which its level was reached."""
    parts = [(times[rows == at], amounts[rows == at]) for rows, times, amounts in attached]
    when = np.concatenate([w for w, _ in parts]) if parts else np.zeros(0, "int64")
    amount = np.concatenate([a for _, a in parts]) if parts else np.zeros(0, "int64")
    if not len(when):
        return ts
    reached = reached_before(np.zeros(len(when), "int64"), when.astype("int64"), amount.astype("int64"),
                             np.array([increment], "int64"), np.array([ts], "int64"))[0]
    return int(reached) if reached >= 0 else ts


@dataclass
class SecondLook:
    """The pass that needs the first look's totals (see the module's docstring)."""

    first: FirstLook
    peaks: list[PeakSeries]
    changes: dict  # pools.PoolUses.changes, queued batch by batch before this look sees the batch
    focus_target: float
    cut_rows: dict  # pid -> the index of the row whose live bytes tell "climbing"
    cut_live: dict = field(default_factory=dict)
    cut_seen: dict = field(default_factory=dict)
    cut_value: dict = field(default_factory=dict)
    moved: float = 0.0
    focus_ts: Optional[int] = None
    closed: list = field(default_factory=list)
    free_ts: dict = field(default_factory=dict)  # allocation seq -> its free's time, for listed ones
    wanted: set = field(default_factory=set)
    # pools.PoolUses: its second look at a batch queues the pools' reserve changes in `changes`, which
    # the peaks take before the engine's turn (its again() then does nothing more)
    pools: Optional[Any] = None

    def __post_init__(self) -> None:
        self.wanted = set(self.first.largest["seq"].tolist()) if not self.first.largest.empty else set()

    def add(self, b: EventBatch) -> None:
        if self.pools is not None:
            self.pools.again(b)
        if len(b) == 0:
            return
        self._peaks(b)  # before the free times: a peak's live set may be freed later in this batch
        frees = np.flatnonzero(b.partner_seq >= 0)
        if self.wanted and len(frees):
            hit = np.isin(b.partner_seq[frees], np.fromiter(self.wanted, "int64"))
            for alloc, ts in zip(b.partner_seq[frees[hit]].tolist(), b.ts[frees[hit]].tolist()):
                self.free_ts[alloc] = ts
        self._cut(b)
        if self.focus_ts is None:
            moving = np.flatnonzero(b.delta != 0)
            moved = np.cumsum(np.concatenate([[self.moved], np.abs(b.delta[moving]).astype("float64")]))[1:]
            at = int(np.searchsorted(moved, self.focus_target, side="left"))
            if at < len(moving):
                self.focus_ts = int(b.ts[moving[at]])
            self.moved = float(moved[-1]) if len(moved) else self.moved
        if len(b.closed.get("seq", [])):
            self.closed.append(pd.DataFrame(b.closed))

    def _peaks(self, b: EventBatch) -> None:
        resident = np.isin(b.kind, RESIDENT)
        pairs = pair_key(b.pid, b.device)
        for peak in self.peaks:  # a few series
            rows = np.flatnonzero(resident & np.isin(pairs, peak.members))
            if not len(rows):
                continue
            added = np.zeros(len(rows), "int64")
            attached = []  # (index in rows, time, bytes) of each change taken
            for member in peak.members.tolist():  # the pools' reserve changes at the next event
                if member not in self.changes:
                    continue
                change_ts, change_bytes, used = self.changes[member]
                mine = np.flatnonzero(pairs[rows] == member)
                if not len(mine) or used >= len(change_ts):
                    continue
                ts = b.ts[rows[mine]]
                upto = int(np.searchsorted(change_ts, ts[-1], side="right"))
                at = np.searchsorted(ts, change_ts[used:upto], side="left")
                np.add.at(added, mine[at], change_bytes[used:upto])
                attached.append((mine[at], change_ts[used:upto], change_bytes[used:upto]))
                self.changes[member] = (change_ts, change_bytes, upto)
            reserve = peak.reserve + np.cumsum(added)
            live = peak.live + np.cumsum(b.delta[rows]) + reserve
            own = (b.kind[rows] != STATIC) & (b.delta[rows] > 0)
            at = int(np.argmax(live))
            if live[at] > peak.best:
                peak.best, peak.best_seq, peak.best_ts = int(live[at]), int(b.seq[rows[at]]), int(b.ts[rows[at]])
                peak.reached_ts = _reached(at, attached, int(added[at] + b.delta[rows[at]]), peak.best_ts) \
                    if b.pool[rows[at]] else peak.best_ts
                peak.best_kind, peak.best_reserve = int(b.kind[rows[at]]), int(reserve[at])
                peak.live_set = self._live_at(b, peak.best_seq, peak.members)
                owns = np.flatnonzero(own[:at + 1])
                if len(owns):
                    peak.note_own_ts = int(b.ts[rows[owns[-1]]])
                    peak.note_statics = int(b.delta[rows[owns[-1] + 1:at + 1]].sum())
                else:
                    peak.note_own_ts = peak.own_ts
                    peak.note_statics = peak.statics_since + int(b.delta[rows[:at + 1]].sum())
                self.wanted |= set(peak.live_set.sort_values("bytes", ascending=False, kind="stable")
                                   ["seq"].head(LIVE_AT_PEAK).tolist())
            owns = np.flatnonzero(own)
            if len(owns):
                peak.own_ts, peak.statics_since = int(b.ts[rows[owns[-1]]]), int(b.delta[rows[owns[-1] + 1:]].sum())
            else:
                peak.statics_since += int(b.delta[rows].sum())
            peak.live, peak.reserve = int(live[-1] - reserve[-1]), int(reserve[-1])

    def _live_at(self, b: EventBatch, seq: int, members: np.ndarray) -> pd.DataFrame:
        """GPU-resident allocations of `members` live right after event `seq` of batch `b`: never
        freed, or freed after it (whole-frame: partner < 0 or partner > seq)."""
        allocs = np.flatnonzero(b.is_alloc & (b.seq <= seq))
        frame = pd.concat([pd.DataFrame(b.live_before)] + self.closed +
                          ([pd.DataFrame(b.closed)] if len(b.closed.get("seq", [])) else []) + [_rows(b, allocs)],
                          ignore_index=True)
        freed = b.partner_seq[(b.partner_seq >= 0) & (b.seq <= seq)]
        # this batch's closed allocations (never to be freed: another allocation took their
        # address) include those made after `seq`, which were not live at it
        keep = (frame["seq"].to_numpy() <= seq) & ~frame["seq"].isin(freed).to_numpy() \
            & frame["kind"].isin(RESIDENT).to_numpy() \
            & np.isin(pair_key(frame["pid"].to_numpy(), frame["device"].to_numpy()), members)
        return frame[keep].drop_duplicates("seq").sort_values("seq", ignore_index=True)

    def _cut(self, b: EventBatch) -> None:
        rows = np.flatnonzero(np.isin(b.kind, RESIDENT))
        for pid, wanted in self.cut_rows.items():  # a few processes
            mine = rows[b.pid[rows] == pid]
            seen = self.cut_seen.get(pid, 0)
            live = self.cut_live.get(pid, 0) + np.cumsum(b.delta[mine])
            if seen <= wanted < seen + len(mine):
                self.cut_value[pid] = int(live[wanted - seen])
            self.cut_seen[pid] = seen + len(mine)
            self.cut_live[pid] = int(live[-1]) if len(mine) else self.cut_live.get(pid, 0)
