"""Peaks: the highest live GPU-resident bytes per process and device, and per GPU, with what was
live there: one reducer (`Peaks`) on both paths, the whole frame as one batch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..base.units import fmt_bytes, fmt_time
from ..engine import Facts, Reducer
from ..events.load import QUICK_API
from ..events.arrays import LOW, among, category_codes, pair_key, pair_of
from ..events.batch import EventBatch, batch_rows
from ..model import GPU_RESIDENT_KINDS, Allocation, Holder, Peak
from .groups import batch_series, group_parts
from .pools import reached_before
from .explore import allocation_groups
from .stacks import stack_bytes

LIVE_AT_PEAK = 20  # allocations listed per peak (largest first); live_count has them all
MADE_OF = 5  # (site, range) pairs listed per peak


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
    own_seq: int = -1
    statics_since: int = 0
    note_own_ts: Optional[int] = None
    note_own_seq: int = -1
    note_statics: int = 0


class Peaks(Reducer):
    """`peaks`, the series of them (PeakSeries, those with `best_seq` >= 0 reached a peak): per
    (process, device) with GPU-resident memory, then per GPU across processes when several share
    one. The first look finds the pairs (and whether any of a pair's rows is not a module static:
    a process's statics alone, loaded into every context it opens while it allocates on another
    GPU, are no peak of their own, as ddp_leak_v25's rank 1 on GPU 0); the second keeps each
    series' running sum of live bytes plus the pools' unused reserve, its first highest point
    (rows are in time order with frees first at equal times) and the allocations live there.
    `Facts.more["pool_uses"]`: the pools' reducer (pools.PoolUses), whose `changes` the series
    take at the next event of their pair at or after each (watched between the looks)."""

    field = "peaks"
    needs = ("pools", "pool_uses")
    second_look = True

    def start(self, facts: Facts) -> None:
        super().start(facts)
        self.resident = [i for i, name in enumerate(facts.kinds) if name in GPU_RESIDENT_KINDS]
        self.static = list(facts.kinds).index("static") if "static" in facts.kinds else -1
        self.pools = facts.more.get("pool_uses")
        self.pairs: dict = {}  # pair key of resident rows -> whether any is not a module static
        self.series: list[PeakSeries] = []

    def add(self, b: EventBatch) -> None:
        made = b.shared.get("groups")
        if made is not None:
            # the batch's (process, device, kind) groups, made for the other reducers already (the
            # flow's): each holds rows of one kind (a pass over every row per batch took 0.2 s
            # at 1e7 events); the whole frame's peaks are found alone on a second core, where
            # grouping 1e7 rows again would cost more than the pass
            pid, device, kind = group_parts(made.keys)
            chosen = np.isin(kind, self.resident)
            keys = pair_key(pid[chosen], device[chosen]).tolist()
            not_static = (kind[chosen] != self.static).tolist()
        else:
            resident = np.isin(b.kind, self.resident)
            if not resident.any():
                return
            pairs = pd.Series(b.kind[resident] != self.static).groupby(pair_key(b.pid[resident], b.device[resident]))
            found = pairs.any()
            keys, not_static = found.index.tolist(), found.tolist()
        for key, other in zip(keys, not_static):  # a few pairs
            self.pairs[int(key)] = self.pairs.get(int(key), False) or bool(other)

    def between(self) -> None:
        gpu_of = self.facts.gpu_of
        keys = sorted(self.pairs, key=pair_of)  # in (process, device) order
        computes_on = {pair_of(k)[0] for k in keys if self.pairs[k]}
        self.series = [PeakSeries(*pair_of(k), gpu_of(*pair_of(k)), np.array([k], "int64")) for k in keys
                       if self.pairs[k] or pair_of(k)[0] not in computes_on]
        sharing: dict[int, list[int]] = {}  # GPU -> the pair keys on it
        for k in keys:
            if gpu_of(*pair_of(k)) is not None:
                sharing.setdefault(gpu_of(*pair_of(k)), []).append(k)
        for gpu, members in sorted(sharing.items()):
            if len({pair_of(k)[0] for k in members}) > 1:
                self.series.append(PeakSeries(None, gpu, gpu, np.array(members, "int64")))
        if self.pools is not None:  # the reserve changes the peaks take
            self.pools.watch({int(m) for s in self.series for m in s.members.tolist()})
        self.closed: list = []  # allocations closed in earlier batches (never freed: their address was taken)

    def again(self, b: EventBatch) -> None:
        if len(b):
            self._peaks(b)
        if len(b.closed.get("seq", [])):
            self.closed.append(pd.DataFrame(b.closed))

    def finish(self, live: dict) -> list[PeakSeries]:
        return self.series

    def _peaks(self, b: EventBatch) -> None:
        rows_of = self._rows_of(b)
        changes = self.pools.changes if self.pools is not None else {}
        for peak in self.series:  # a few series
            rows = rows_of(peak.members)
            if not len(rows):
                continue
            pairs = _Pairs(b, rows, peak.members)
            added = np.zeros(len(rows), "int64")
            attached = []  # (index in rows, time, bytes) of each change taken
            for member in peak.members.tolist():  # the pools' reserve changes at the next event
                if member not in changes:
                    continue
                change_ts, change_bytes, used = changes[member]
                mine = pairs.of(member)
                if not len(mine) or used >= len(change_ts):
                    continue
                ts = b.ts[rows[mine]]
                upto = int(np.searchsorted(change_ts, ts[-1], side="right"))
                at = np.searchsorted(ts, change_ts[used:upto], side="left")
                np.add.at(added, mine[at], change_bytes[used:upto])
                attached.append((mine[at], change_ts[used:upto], change_bytes[used:upto]))
                changes[member] = (change_ts, change_bytes, upto)
            reserve = peak.reserve + np.cumsum(added)
            live = peak.live + np.cumsum(b.delta[rows]) + reserve
            own = (b.kind[rows] != self.static) & (b.delta[rows] > 0)
            at = int(np.argmax(live))
            if live[at] > peak.best:
                peak.best, peak.best_seq, peak.best_ts = int(live[at]), int(b.seq[rows[at]]), int(b.ts[rows[at]])
                peak.reached_ts = _reached(at, attached, int(added[at] + b.delta[rows[at]]), peak.best_ts) \
                    if b.pool[rows[at]] else peak.best_ts
                peak.best_kind, peak.best_reserve = int(b.kind[rows[at]]), int(reserve[at])
                peak.live_set = live_at(b, peak.best_seq, peak.members, self.resident, self.closed)
                owns = np.flatnonzero(own[:at + 1])
                if len(owns):
                    peak.note_own_ts, peak.note_own_seq = int(b.ts[rows[owns[-1]]]), int(b.seq[rows[owns[-1]]])
                    peak.note_statics = int(b.delta[rows[owns[-1] + 1:at + 1]].sum())
                else:
                    peak.note_own_ts, peak.note_own_seq = peak.own_ts, peak.own_seq
                    peak.note_statics = peak.statics_since + int(b.delta[rows[:at + 1]].sum())
            owns = np.flatnonzero(own)
            if len(owns):
                peak.own_ts, peak.own_seq = int(b.ts[rows[owns[-1]]]), int(b.seq[rows[owns[-1]]])
                peak.statics_since = int(b.delta[rows[owns[-1] + 1:]].sum())
            else:
                peak.statics_since += int(b.delta[rows].sum())
            peak.live, peak.reserve = int(live[-1] - reserve[-1]), int(reserve[-1])

    def _rows_of(self, b: EventBatch) -> Callable[[np.ndarray], np.ndarray]:
        """members -> the batch's rows of kinds `resident` and pairs `members`, in time order: from
        the batch's (process, device) series when the other reducers have made its groups (the
        flow's), else from masks over the batch (the whole frame's peaks are found alone, where
        grouping the rows again would cost more than the masks)."""
        if b.shared.get("groups") is not None:
            found = {int(pair_key(np.array([p]), np.array([d]))[0]): rows for (p, d), rows, _ in
                     batch_series(b, self.resident)}
            nothing = np.zeros(0, "int64")

            def rows_of(members: np.ndarray) -> np.ndarray:
                parts = [found.get(m, nothing) for m in members.tolist()]
                return parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts), kind="stable")
            return rows_of
        resident = among(b.kind, self.resident)
        pairs = pair_key(b.pid, b.device)
        return lambda members: np.flatnonzero(resident & among(pairs, members))


class _Pairs:
    """The positions among a series' `rows` of each member pair's (all of them, for a series of one)."""

    def __init__(self, b: EventBatch, rows: np.ndarray, members: np.ndarray) -> None:
        self.b, self.rows, self.one = b, rows, len(members) == 1
        self.keys: Optional[np.ndarray] = None

    def of(self, member: int) -> np.ndarray:
        if self.one:
            return np.arange(len(self.rows))
        if self.keys is None:
            self.keys = pair_key(self.b.pid[self.rows], self.b.device[self.rows])
        return np.flatnonzero(self.keys == member)


def live_at(b: EventBatch, seq: int, members: np.ndarray, resident: list[int], closed: list) -> pd.DataFrame:
    """The allocations of kinds `resident` and pairs `members` live right after event `seq` of
    batch `b` (batch_rows' columns, by seq): those live before the batch, closed in earlier
    batches (`closed`: their frames) or in this one, or made in it up to `seq`, and not freed by then."""
    upto = int(np.searchsorted(b.seq, seq, side="right"))
    freed = b.partner_seq[:upto]
    freed = freed[freed >= 0]
    # the batch's allocations freed by then left out by their place before any row is copied
    # (the whole frame: a live set, not every allocation made before the peak); the seqs of a
    # flow's batch or of the whole frame follow each other, so a seq's place is its offset from
    # the first (a search for millions of frees in no order took 0.1-0.5 s per peak at 1e7 events)
    consecutive = int(b.seq[upto - 1]) - int(b.seq[0]) == upto - 1
    at = freed - int(b.seq[0]) if consecutive else np.searchsorted(b.seq[:upto], freed)
    inside = (at >= 0) & (at < upto)
    at = at[inside][b.seq[at[inside]] == freed[inside]]
    gone = np.zeros(upto, bool)
    gone[at] = True
    allocs = np.flatnonzero(b.is_alloc[:upto] & ~gone)
    allocs = allocs[among(b.kind[allocs], resident) & among(pair_key(b.pid[allocs], b.device[allocs]), members)]
    frame = pd.concat([pd.DataFrame(b.live_before)] + closed +
                      ([pd.DataFrame(b.closed)] if len(b.closed.get("seq", [])) else []) + [batch_rows(b, allocs)],
                      ignore_index=True)
    # this batch's closed allocations (never to be freed: another allocation took their
    # address) include those made after `seq`, which were not live at it
    keep = (frame["seq"].to_numpy() <= seq) & ~np.isin(frame["seq"].to_numpy(), freed) \
        & among(frame["kind"].to_numpy(), resident) \
        & among(pair_key(frame["pid"].to_numpy(), frame["device"].to_numpy()), members)
    return frame[keep].drop_duplicates("seq").sort_values("seq", ignore_index=True)


def _reached(at: int, attached: list, increment: int, ts: int) -> int:
    """When the level at row `at` of a batch's series was first reached: the earliest of the pool
    changes attached to it (`attached`: (rows, times, bytes) per member) by which it already was
    (a pool created with its reserve inside a cudaMallocAsync; pools.reached_before), else `ts`."""
    parts = [(times[rows == at], amounts[rows == at]) for rows, times, amounts in attached]
    when = np.concatenate([w for w, _ in parts]) if parts else np.zeros(0, "int64")
    amount = np.concatenate([a for _, a in parts]) if parts else np.zeros(0, "int64")
    if not len(when):
        return ts
    reached = reached_before(np.zeros(len(when), "int64"), when.astype("int64"), amount.astype("int64"),
                             np.array([increment], "int64"), np.array([ts], "int64"))[0]
    return int(reached) if reached >= 0 else ts


def peak_of(s: PeakSeries, frame: pd.DataFrame, rows: np.ndarray, event: tuple[str, str], total: Optional[int],
            listed: Callable[[np.ndarray], list[Allocation]], site_table: dict) -> Peak:
    """The Peak of series `s` (one that reached its peak), its live set described by the `rows` of
    `frame` (an events frame: the whole frame, or the streamed flow's rows of the live set), in
    seq order; `event`: the API name and NVTX range of the event that reached it; `listed`: the
    allocations of the live set's positions given, largest first."""
    largest = np.argsort(-frame["bytes"].to_numpy()[rows], kind="stable")[:LIVE_AT_PEAK]
    return Peak(made_of=made_of(frame, rows), pid=s.pid, device=s.device, gpu=s.gpu, peak_bytes=s.best,
                peak_time_ns=s.reached_ts, nvtx_range=event[1], api=event[0], total_memory_bytes=total,
                live_count=int(len(rows)), live_at_peak=listed(largest), pool_reserve_bytes=s.best_reserve,
                live_groups=allocation_groups(frame, rows, site_table), live_stacks=stack_bytes(frame, rows))


def module_load_note(s: PeakSeries, own_api: Optional[str]) -> str:
    """What a peak reached by a module load (a few bytes of kernel-image statics) stands on: the
    statics counted since the series' last own allocation, and that allocation's API (`own_api`;
    None: unknown to a quick analysis)."""
    if s.note_own_ts is None:
        return "reached by module statics (kernel-image globals loaded with the GPU code)"
    return (f"a module load added {fmt_bytes(s.note_statics)} of kernel-image statics at that moment, on top "
            f"of the level {own_api or QUICK_API} reached at {fmt_time(s.note_own_ts)}")


def made_of(events: pd.DataFrame, rows: np.ndarray, limit: int = MADE_OF) -> list[Holder]:
    """The live allocations `rows` summed by call site, largest first; a site's NVTX range is named
    when all its allocations share one."""
    # Category codes, not strings: a peak of a large capture has 1e5 allocations live.
    site, name = events["site"], events["nvtx_range"]
    site_codes = category_codes(site)[rows].astype("int64")
    name_codes = category_codes(name)[rows].astype("int64")
    sizes = events["bytes"].to_numpy()[rows]
    present, slot = np.unique(site_codes, return_inverse=True)
    totals = np.zeros(len(present), "int64")
    np.add.at(totals, slot, sizes)
    counts = np.bincount(slot, minlength=len(present))
    pairs = np.unique(slot.astype("int64") << 32 | (name_codes & 0xFFFFFFFF))
    names_per_site = np.bincount((pairs >> 32).astype("int64"), minlength=len(present))
    first_name = name_codes[np.unique(slot, return_index=True)[1]]
    result = []
    for i in np.argsort(-totals, kind="stable")[:limit]:  # capped
        code = int(first_name[i])
        result.append(Holder(site=str(site.cat.categories[present[i]]) if present[i] >= 0 else "",
                             nvtx_range=str(name.cat.categories[code]) if names_per_site[i] == 1 and code >= 0 else "",
                             bytes=int(totals[i]), allocations=int(counts[i])))
    return result


def headline(peaks: list[Peak]) -> Optional[Peak]:
    """The highest per-process peak (earliest on ties)."""
    return max((p for p in peaks if p.pid is not None), key=lambda p: (p.peak_bytes, -p.peak_time_ns), default=None)
