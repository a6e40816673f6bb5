"""allocator.allocator_use and oom._cache_releases over a flow of event batches, in bounded memory
(the streamed full analysis, streamed_full.py).

Whether an allocation is outside a caching allocator (allocator.outside_allocator) depends only on
it and the allocation before it on its thread: carried across batches per (process, device,
thread). So the first pass counts what allocator.recognize reads (segment and map sizes) and
finds the bursts of frees for both calls an allocator releases with (cudaFree, cuMemUnmap), as
running state per (process, device); the second, knowing each pair's allocator and preallocated
block, sums the live bytes of each class of allocation (outside or not, mapped or not, the block
or not), read at each peak as it is raised and at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..events.arrays import previous_in_group
from ..model import KINDS, AllocatorUse, CacheRelease, Preallocation
from .allocator import LARGE_SEGMENT, LIBRARY_BURST_NS, PREALLOCATION_SHARE, SEGMENT_ALIGN, SMALL_SEGMENT, \
    VMM_MAP_API, _message
from .oom import BURST_GAP_NS, BURST_MIN_BLOCKS, MAX_RELEASES, _RELEASE_API
from .streamed import pair_key

DEVICE = KINDS.index("device")
# allocation classes: bit 0 outside_allocator, bit 1 a VMM map, bit 2 the pair's preallocated block
OUTSIDE, MAPPED, BLOCK = 1, 2, 4
RELEASE_APIS = ("cudaFree", "cuMemUnmap")  # the calls a caching allocator gives segments back with
# per pair, what recognize reads: maps, maps of other sizes than 2/20 MiB, of 20 MiB; segments
# (neither outside nor mapped), unaligned ones, of 2 MiB, of 20 MiB
COUNTS = ("mapped", "mapped_other", "mapped_large", "segments", "unaligned", "small", "large")


class AllocatorRows:
    """Each batch's device allocations outside pools (allocator_use's `mine`) with their pair key
    and class bits OUTSIDE and MAPPED; the thread's last allocation carried across batches."""

    def __init__(self, api_names: list[str]) -> None:
        self.map_code = api_names.index(VMM_MAP_API) if VMM_MAP_API in api_names else -2
        self.last: dict[tuple[int, int], tuple[bool, int]] = {}  # (pair, tid) -> (odd, ts) of its last

    def of(self, b) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, pair keys, class bits) of the batch's allocations the allocators are judged on."""
        rows = np.flatnonzero(b.is_alloc & (b.kind == DEVICE) & ~b.pool)
        pair = pair_key(b.pid[rows], b.device[rows])
        if not len(rows):
            return rows, pair, np.zeros(0, "int64")
        size, ts, tid = b.bytes[rows], b.ts[rows], b.calls["tid"][rows].astype("int64")
        odd = size % SEGMENT_ALIGN != 0
        pair_code, pairs = pd.factorize(pair)
        code, keys = pd.factorize((pair_code.astype("int64") << 32) | (tid & 0xFFFFFFFF))
        previous = previous_in_group(code, len(keys))
        has = previous >= 0
        before = np.maximum(previous, 0)
        prev_odd, prev_ts = np.where(has, odd[before], False), np.where(has, ts[before], 0)
        firsts = np.flatnonzero(~has)  # each thread's first in the batch: its last before, carried
        for i in firsts.tolist():  # one per (pair, thread)
            carried = self.last.get((int(pair[i]), int(tid[i])))
            if carried is not None:
                has[i], prev_odd[i], prev_ts[i] = True, carried[0], carried[1]
        outside = odd | (has & prev_odd & (ts - prev_ts <= LIBRARY_BURST_NS))
        ends = np.flatnonzero(previous_in_group(code[::-1], len(keys)) < 0)  # the last of each, backwards
        for i in (len(code) - 1 - ends).tolist():  # each thread's last allocation in the batch
            self.last[(int(pair[i]), int(tid[i]))] = (bool(odd[i]), int(ts[i]))
        # the whole frame's batch carries no API names (nor needs them: ByteClassSums reads OUTSIDE)
        mapped = b.calls["api"][rows] == self.map_code if "api" in b.calls else np.zeros(len(rows), bool)
        return rows, pair, outside.astype("int64") * OUTSIDE + mapped.astype("int64") * MAPPED


class OutsideRows:
    """AllocatorRows' OUTSIDE bit of chosen allocations only (ByteClassSums reads it of the few
    kept after the last step or live after a batch, not of 5 million at 1e7 events): an odd size,
    or the allocation before it on its thread odd and at most LIBRARY_BURST_NS before. That
    allocation, when it can matter, is among the rows of the LIBRARY_BURST_NS before the chosen
    one, looked for backwards a few rows at a time; a thread's last allocation is carried to the
    next batch while a later one can be within LIBRARY_BURST_NS of it."""

    def __init__(self) -> None:
        self.last: dict[tuple[int, int], tuple[bool, int]] = {}  # (pair, tid) -> (odd, ts) of its last

    def of(self, b, rows: np.ndarray) -> np.ndarray:
        """Whether each of the batch's `rows` (ascending) is an allocation outside; once per batch,
        in order (the threads' last allocations are carried)."""
        outside = np.zeros(len(rows), bool)
        judged = np.flatnonzero(_judged(b, rows))
        if len(judged):
            i = rows[judged]
            odd = b.bytes[i] % SEGMENT_ALIGN != 0
            outside[judged[odd]] = True
            i, judged = i[~odd], judged[~odd]
            lo = np.searchsorted(b.ts, b.ts[i] - LIBRARY_BURST_NS, side="left")
            previous = _previous(b, i, lo)
            has = previous >= 0
            outside[judged[has]] = b.bytes[previous[has]] % SEGMENT_ALIGN != 0
            # none in the batch, the window reaching back before its first row: the thread's
            # last allocation of an earlier batch
            for k in np.flatnonzero(~has & (lo == 0)).tolist():
                carried = self.last.get(_thread(b, i[k]))
                if carried is not None and carried[0] and b.ts[i[k]] - carried[1] <= LIBRARY_BURST_NS:
                    outside[judged[k]] = True
        self._carry(b)
        return outside

    def _carry(self, b) -> None:
        """Each thread's last allocation of the batch's last LIBRARY_BURST_NS (an older one can
        matter to no later row)."""
        if not len(b):
            return
        since = int(b.ts[-1]) - LIBRARY_BURST_NS
        self.last = {key: last for key, last in self.last.items() if last[1] >= since}
        tail = int(np.searchsorted(b.ts, since, side="left"))
        rows = tail + np.flatnonzero(_judged(b, slice(tail, None)))
        threads = zip(pair_key(b.pid[rows], b.device[rows]).tolist(), b.calls["tid"][rows].tolist())
        # the allocations of the batch's last LIBRARY_BURST_NS, in order: a thread's last stays
        for thread, odd, ts in zip(threads, (b.bytes[rows] % SEGMENT_ALIGN != 0).tolist(), b.ts[rows].tolist()):
            self.last[thread] = (odd, ts)


def _judged(b, rows) -> np.ndarray:
    """Whether each row is one AllocatorRows judges: a device allocation outside pools."""
    return b.is_alloc[rows] & (b.kind[rows] == DEVICE) & ~b.pool[rows]


def _thread(b, row: int) -> tuple[int, int]:
    return (int(pair_key(b.pid[row:row + 1], b.device[row:row + 1])[0]), int(b.calls["tid"][row]))


# rows looked at by _previous at a time (its temporaries are a few bytes per row), then all at once
LOOK_BACK_ROWS = 1 << 20


def _previous(b, rows: np.ndarray, lo: np.ndarray, widest: int = 512) -> np.ndarray:
    """The row of each row's thread's allocation before it (judged rows only) within [lo, row),
    -1 for none: a few rows back at a time, doubling; those not found within `widest` rows back
    (or too many to look at so) from all judged rows of their span at once (previous_in_group),
    as AllocatorRows finds them."""
    found = np.full(len(rows), -1, "int64")
    pair, tid = pair_key(b.pid[rows], b.device[rows]), b.calls["tid"][rows]
    todo, end, width = np.arange(len(rows)), rows.copy(), 8
    while len(todo) and width <= widest and len(todo) * width <= LOOK_BACK_ROWS:
        at = end[todo, None] - np.arange(1, width + 1)  # rows end - 1, end - 2, ... back
        inside = at >= lo[todo, None]
        at = np.maximum(at, 0)
        match = inside & _judged(b, at) & (pair_key(b.pid[at], b.device[at]) == pair[todo, None]) \
            & (b.calls["tid"][at] == tid[todo, None])
        hit = match.any(axis=1)
        found[todo[hit]] = at[hit, match[hit].argmax(axis=1)]
        end[todo] -= width
        todo = todo[~hit & (end[todo] > lo[todo])]
        width *= 2
    if len(todo):
        span = np.arange(int(lo[todo].min()), int(rows[todo].max()) + 1)
        span = span[_judged(b, span)]
        code, _ = pd.factorize((pair_key(b.pid[span], b.device[span]) << 32)
                               | (b.calls["tid"][span].astype("int64") & 0xFFFFFFFF))
        before = previous_in_group(code, int(code.max()) + 1)[np.searchsorted(span, rows[todo])]
        ok = before >= 0
        before = np.where(ok, span[np.maximum(before, 0)], -1)
        found[todo] = np.where(ok & (before >= lo[todo]), before, -1)
    return found


@dataclass
class Bursts:
    """oom._cache_releases' bursts of one (pair, release API), found batch by batch: the running
    live bytes of its own rows (allocations and that API's frees), the burst still open, and the
    first MAX_RELEASES bursts of BURST_MIN_BLOCKS frees or more."""

    live: int = 0
    rows: int = 0  # own rows so far
    last_free: bool = False
    last_ts: int = 0
    last_alloc: int = -1  # own row number of the last allocation
    open: Optional[list] = None  # [start row, start ts, tid, before, blocks, released, end row, end ts, after]
    found: list = field(default_factory=list)

    def add(self, delta: np.ndarray, ts: np.ndarray, tid: np.ndarray) -> None:
        n = len(delta)
        if not n:
            return
        number = self.rows + np.arange(n)
        live = self.live + np.cumsum(delta)
        is_free = delta < 0
        prev_free = np.concatenate([[self.last_free], is_free[:-1]])
        prev_ts = np.concatenate([[self.last_ts], ts[:-1]])
        continues = is_free & prev_free & (ts - prev_ts <= BURST_GAP_NS)
        starts = np.flatnonzero(is_free & ~continues)
        # the open burst ends at this batch's first row that does not continue it
        if self.open is not None:
            stop = int(np.argmin(continues)) if not continues.all() else n
            if stop:
                self.open[4] += stop
                self.open[5] += int(-delta[:stop].sum())
                self.open[6:9] = [int(number[stop - 1]), int(ts[stop - 1]), int(live[stop - 1])]
            if stop < n:
                self._close()
        # new bursts: each start and the rows that continue it
        if len(starts):
            run_of = np.cumsum(is_free & ~continues) - 1
            in_run = is_free & (run_of >= 0)
            sizes = np.bincount(run_of[in_run], minlength=len(starts))
            ends = starts + sizes - 1
            # the bursts that end here while there is room to keep them, and the run still open
            room = max(MAX_RELEASES - len(self.found), 0)
            ending = np.flatnonzero((sizes >= BURST_MIN_BLOCKS) & (ends < n - 1))[:room].tolist()
            for k in ending + ([len(starts) - 1] if ends[-1] == n - 1 else []):
                a, z = int(starts[k]), int(ends[k])
                self.open = [int(number[a]), int(ts[a]), int(tid[a]), int(live[a] - delta[a]), int(sizes[k]),
                             int(-delta[a:z + 1].sum()),
                             int(number[z]), int(ts[z]), int(live[z])]
                if z < n - 1:
                    self._close()
        allocs = np.flatnonzero(delta > 0)
        if len(allocs):
            self.last_alloc = int(number[allocs[-1]])
        self.live, self.rows = int(live[-1]), self.rows + n
        self.last_free, self.last_ts = bool(is_free[-1]), int(ts[-1])

    def finish(self) -> None:
        if self.open is not None:
            self._close()

    def _close(self) -> None:
        if self.open[4] >= BURST_MIN_BLOCKS and len(self.found) < MAX_RELEASES:
            self.found.append(self.open)
        self.open = None


class FirstAllocators:
    """The first pass: what recognize reads per pair, and each pair's bursts per release API."""

    def __init__(self, api_names: list[str]) -> None:
        self.rows = AllocatorRows(api_names)
        self.counts: dict[int, np.ndarray] = {}  # pair key -> COUNTS
        self.release_codes = [api_names.index(a) if a in api_names else -2 for a in RELEASE_APIS]
        self.bursts: dict[tuple[int, str], Bursts] = {}

    def add(self, b) -> None:
        if len(b) == 0:
            return
        rows, pair, bits = self.rows.of(b)
        if len(rows):
            size = b.bytes[rows]
            mapped, segment = (bits & MAPPED) != 0, (bits & (OUTSIDE | MAPPED)) == 0
            flags = np.stack([mapped, mapped & (size != SMALL_SEGMENT) & (size != LARGE_SEGMENT),
                              mapped & (size == LARGE_SEGMENT), segment, segment & (size % SEGMENT_ALIGN != 0),
                              segment & (size == SMALL_SEGMENT), segment & (size == LARGE_SEGMENT)], axis=1)
            _add_by(self.counts, pair, flags.astype("int64"))
        device = np.flatnonzero(b.kind == DEVICE)
        if not len(device):
            return
        pairs = pair_key(b.pid[device], b.device[device])
        api = b.calls["api"][device]
        for key in pd.unique(pairs).tolist():  # a few (process, device) pairs
            mine = device[pairs == key]
            for name, code in zip(RELEASE_APIS, self.release_codes):
                own = mine[(b.delta[mine] > 0) | (api[pairs == key] == code)]
                self.bursts.setdefault((key, name), Bursts()).add(b.delta[own], b.ts[own],
                                                                  b.calls["tid"][own].astype("int64"))

    def finish(self) -> None:
        for bursts in self.bursts.values():
            bursts.finish()

    def recognized(self, key: int, is_python: bool) -> Optional[str]:
        """allocator.recognize from the counts of one pair."""
        c = dict(zip(COUNTS, self.counts.get(key, np.zeros(len(COUNTS), "int64")).tolist()))
        if c["mapped"] >= 3 and not c["mapped_other"] and c["mapped_large"]:
            return "pytorch_expandable"
        if c["segments"] < 3 or c["unaligned"]:
            return None
        if c["small"] and (c["large"] or is_python):
            return "pytorch_caching"
        return None

    def releases(self, caching: dict[tuple[int, int], str], gpu_of, paths: Callable) -> list[CacheRelease]:
        """_cache_releases of the pairs a caching allocator manages (`caching`: its kind);
        `paths(pid, tids, times)`: the NVTX paths of events."""
        found = []
        for (pid, device), kind in sorted(caching.items()):
            bursts = self.bursts.get((int(pair_key(np.array([pid]), np.array([device]))[0]),
                                      _RELEASE_API.get(kind, "cudaFree")))
            if bursts is None or not bursts.found:
                continue
            chosen = bursts.found[:MAX_RELEASES - len(found)]
            named = paths(pid, np.array([b[2] for b in chosen], "int64"), np.array([b[1] for b in chosen], "int64"))
            for (start, start_ts, _, before, blocks, released, end, end_ts, after), path in zip(chosen, named):
                found.append(CacheRelease(
                    pid=pid, device=device, gpu=gpu_of(pid, device), start_ns=start_ts, end_ns=end_ts, blocks=blocks,
                    released_bytes=released, nvtx_path=str(path), live_before_bytes=before, live_after_bytes=after,
                    followed_by_allocation=bursts.last_alloc > end))
            if len(found) >= MAX_RELEASES:
                break
        return found


def _add_by(sums: dict, keys: np.ndarray, values: np.ndarray) -> None:
    """sums[key] += the rows of `values` (2-d, int64) with that key, for each key present."""
    if not len(keys):
        return
    code, distinct = pd.factorize(keys)
    total = np.zeros((len(distinct), values.shape[1]), "int64")
    np.add.at(total, code, values)
    for key, row in zip(distinct.tolist(), total):  # a few (process, device) pairs
        sums[key] = sums[key] + row if key in sums else row


def _add_by_class(sums: dict, keys: np.ndarray, classes: np.ndarray, values: np.ndarray) -> None:
    """sums[key][class] += the `values` of that key and class (8 classes), for each key present."""
    if not len(keys):
        return
    code, distinct = pd.factorize(keys)
    total = np.zeros(len(distinct) * 8, "int64")
    np.add.at(total, code * 8 + classes, values)
    for key, row in zip(distinct.tolist(), total.reshape(-1, 8)):  # a few (process, device) pairs
        sums[key] = sums[key] + row if key in sums else row


def preallocated_blocks(big_blocks: list[pd.DataFrame], gpu_of, total_memory) -> dict[int, tuple[int, int]]:
    """pair key -> (time, bytes) of the block find_preallocations finds on it (from the first
    pass's blocks of a GiB or more, in time order)."""
    found: dict[int, tuple[int, int]] = {}
    if not big_blocks:
        return found
    frame = pd.concat(big_blocks, ignore_index=True).sort_values("seq", kind="stable")
    for pid, device, size, ts in frame[["pid", "device", "bytes", "ts"]].itertuples(index=False):  # a handful
        total = total_memory(gpu_of(int(pid), int(device)))
        key = int(pair_key(np.array([pid]), np.array([device]))[0])
        if not total or size < PREALLOCATION_SHARE * total or key in found:
            continue
        found[key] = (int(ts), int(size))
    return found


class SecondAllocators:
    """The second pass: the live bytes of each class of allocation per pair, read at each peak of
    `peaks` (SecondLook's PeakSeries, pid set) as it is raised, and at the end; each class's count."""

    def __init__(self, api_names: list[str], peaks: list, blocks: dict[int, tuple[int, int]]) -> None:
        self.rows = AllocatorRows(api_names)
        self.peaks = [p for p in peaks if p.pid is not None]
        self.blocks = blocks
        self.sums: dict[int, np.ndarray] = {}  # pair key -> live bytes per class
        self.counts: dict[int, np.ndarray] = {}  # pair key -> allocations per class
        self.at_peak: dict[int, np.ndarray] = {}  # pair key -> live bytes per class at its peak
        self.seen: dict[int, int] = {}  # id(peak) -> the best_seq read
        # the live allocations counted: seq (in order), pair key, class, bytes
        self.live = {"seq": np.zeros(0, "int64"), "pair": np.zeros(0, "int64"), "cls": np.zeros(0, "int64"),
                     "bytes": np.zeros(0, "int64")}

    def add(self, b) -> None:
        if len(b) == 0:
            return
        rows, pair, bits = self.rows.of(b)
        for key, (ts, size) in self.blocks.items():  # the preallocated block of a pair, if it has one
            bits = bits | np.where((pair == key) & (b.ts[rows] == ts) & (b.bytes[rows] == size), BLOCK, 0)
        _add_by_class(self.counts, pair, bits, np.ones(len(bits), "int64"))
        live = self.live
        known = {"seq": np.concatenate([live["seq"], b.seq[rows]]), "pair": np.concatenate([live["pair"], pair]),
                 "cls": np.concatenate([live["cls"], bits]), "bytes": np.concatenate([live["bytes"], b.bytes[rows]])}
        # each change: an allocation counted (+), or the free of one (-), at its row in the batch
        frees = np.flatnonzero(b.partner_seq >= 0)
        at = np.searchsorted(known["seq"], b.partner_seq[frees])
        # (none counted yet, as when a batch frees only what the counted kinds never held: no hit)
        hit = (at < len(known["seq"])) & (known["seq"][np.minimum(at, max(len(known["seq"]) - 1, 0))]
                                          == b.partner_seq[frees]) if len(known["seq"]) else np.zeros(len(frees), bool)
        frees, at = frees[hit], at[hit]
        position = np.concatenate([rows, frees])
        change_pair = np.concatenate([pair, known["pair"][at]])
        change_cls = np.concatenate([bits, known["cls"][at]])
        change = np.concatenate([b.bytes[rows], -known["bytes"][at]])
        for peak in self.peaks:  # the peaks raised in this batch: the split after their moment
            if peak.best_seq < 0 or self.seen.get(id(peak)) == peak.best_seq:
                continue
            self.seen[id(peak)] = peak.best_seq
            key = int(peak.members[0])
            cut = int(np.searchsorted(b.ts, peak.best_ts, side="right"))
            mine = np.flatnonzero((change_pair == key) & (position < cut))
            split = self.sums.get(key, np.zeros(8, "int64")).copy()
            np.add.at(split, change_cls[mine], change[mine])
            self.at_peak[key] = split
        _add_by_class(self.sums, change_pair, change_cls, change)
        still = np.ones(len(known["seq"]), bool)
        still[at] = False  # freed in this batch
        self.live = {c: v[still] for c, v in known.items()}

    def uses(self, peaks: list, kind_of: Callable[[int, int], Optional[str]], preallocations: list[Preallocation],
             gpu_of, label: Callable[[int], str]) -> list[AllocatorUse]:
        """allocator_use's list: `kind_of(pid, device)` recognizes a pair's allocator."""
        prealloc = {(p.pid, p.device): p for p in preallocations}
        found = []
        for pid, device in sorted({(p.pid, p.device) for p in peaks if p.pid is not None}):
            key = int(pair_key(np.array([pid]), np.array([device]))[0])
            if (pid, device) in prealloc:
                kind = "xla_preallocation" if prealloc[(pid, device)].framework == "XLA" else "preallocation"
                inside = np.array([(c & BLOCK) != 0 for c in range(8)])
            else:
                kind = kind_of(pid, device)
                if kind is None:
                    continue
                outside = OUTSIDE | MAPPED if kind == "pytorch_caching" else OUTSIDE
                inside = np.array([(c & outside) == 0 for c in range(8)])
            zero = np.zeros(8, "int64")
            at_peak, end = self.at_peak.get(key, zero), self.sums.get(key, zero)
            count = int(self.counts.get(key, zero)[~inside].sum())
            inside_peak, outside_peak = int(at_peak[inside].sum()), int(at_peak[~inside].sum())
            found.append(AllocatorUse(
                pid=pid, device=device, gpu=gpu_of(pid, device), allocator=kind, inside_at_peak_bytes=inside_peak,
                outside_at_peak_bytes=outside_peak, inside_end_bytes=int(end[inside].sum()),
                outside_end_bytes=int(end[~inside].sum()), outside_allocations=count,
                message=_message(kind, label(pid), gpu_of(pid, device), device, inside_peak, outside_peak, count)))
        return found
