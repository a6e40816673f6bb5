"""Reserved versus used: which framework allocator holds a process's device memory, and how much.

nsys records what an allocator reserves from the driver (cudaMalloc segments, VMM maps, one
preallocated block), never what its tensors use inside. So the verdict is in plain words: these
bytes are reserved; growth per step is the signal.

PyTorch's caching allocator asks cudaMalloc only for segments of 2 MiB (its small pool), 20 MiB
(requests of 1-10 MiB) or a multiple of 2 MiB (larger ones); with `expandable_segments` it maps
2 MiB / 20 MiB pieces through the virtual-memory API, which nsys records at `cuMemSetAccess`.
Anything else a process allocates directly (a library's workspace, e.g. cuBLAS's 1 KiB + 128 KiB
+ 64 MiB made together on each thread that first calls it) is outside the allocator.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import pandas as pd

from ..base.units import fmt_bytes
from ..engine import GpuOf, Reducer
from ..events.arrays import one_pair_key, pair_key, previous_in_group
from ..model import KINDS, AllocatorUse, Peak, Preallocation

MiB = 1 << 20
SEGMENT_ALIGN = 2 * MiB  # every caching-allocator segment is a multiple of this
SMALL_SEGMENT, LARGE_SEGMENT = 2 * MiB, 20 * MiB
# A library initializing allocates a few blocks in a row on one thread: odd sizes, then its
# workspace right after (cuBLAS: 1 KiB, 128 KiB, then 64 MiB 75 µs later on torch_leak_v25; the
# allocator's own 32 MiB segment 150 µs after that is not part of it).
LIBRARY_BURST_NS = 1_000_000
VMM_MAP_API = "cuMemSetAccess"
_DIRECT_APIS = ("cudaMalloc", "cuMemAlloc", VMM_MAP_API)

DEVICE = KINDS.index("device")
# allocation classes: bit 0 outside the allocator, bit 1 a VMM map, bit 2 the pair's preallocated block
OUTSIDE, MAPPED, BLOCK = 1, 2, 4
SLICE_ROWS = 1 << 20  # rows of a batch judged at a time
# per pair, what recognizing its allocator reads: maps, maps of other sizes than 2/20 MiB, of 20
# MiB; segments (neither outside nor mapped), unaligned ones, of 2 MiB, of 20 MiB
COUNTS = ("mapped", "mapped_other", "mapped_large", "segments", "unaligned", "small", "large")


class AllocatorRows:
    """Each batch's device allocations outside pools, with their pair key and class bits OUTSIDE
    (not a caching-allocator segment: a size that is not a multiple of 2 MiB, or the allocation
    made next on the same thread within LIBRARY_BURST_NS after one: the library's workspace) and
    MAPPED (a VMM map).

    Only the allocations after an odd one can be outside for being next to it (2% of them at
    1e7 events): each odd allocation looks forward for its thread's next within
    LIBRARY_BURST_NS, a few rows at a time (as OutsideRows looks back), instead of every
    allocation finding its thread's previous one (two hash passes over 4.7 million at 1e7
    events). An odd allocation still the last of its thread at the end of a batch, and
    LIBRARY_BURST_NS or less before it, is carried to the next."""

    def __init__(self, api_names: Sequence[str]) -> None:
        self.map_code = list(api_names).index(VMM_MAP_API) if VMM_MAP_API in api_names else -2
        self.odd_last: dict[tuple[int, int], int] = {}  # (pair, tid) -> time of its last, odd, allocation

    def of(self, b) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rows, the number of each one's pair among `pairs`, `pairs`: the distinct pair keys in
        order of first appearance, class bits) of the batch's allocations the allocators are
        judged on."""
        rows = np.flatnonzero(b.is_alloc & (b.kind == DEVICE) & ~b.pool)
        pair = pair_key(b.pid[rows], b.device[rows])
        if not len(rows):
            return rows, np.zeros(0, "int64"), pair, np.zeros(0, "int64")
        size, ts, tid = b.bytes[rows], b.ts[rows], b.calls["tid"][rows].astype("int64")
        odd = (size & (SEGMENT_ALIGN - 1)) != 0  # (size % SEGMENT_ALIGN, a power of two: a mask, no division)
        pair_code, pairs = pd.factorize(pair)
        thread = (pair_code.astype("int64") << 32) | (tid & 0xFFFFFFFF)  # one number per (pair, thread)
        outside = odd.copy()
        code_of = {int(key): c for c, key in enumerate(pairs.tolist())}  # a few (process, device) pairs
        carried, self.odd_last = self.odd_last, {}
        for (key, t), at in carried.items():  # a handful: the odd allocations at the last batch's end
            end = int(np.searchsorted(ts, at + LIBRARY_BURST_NS, side="right"))
            mine = np.flatnonzero(thread[:end] == ((code_of[key] << 32) | (t & 0xFFFFFFFF))) \
                if key in code_of else np.zeros(0, "int64")
            outside[mine[:1]] = True
            if not len(mine) and end == len(ts):  # none yet: still its thread's last
                self.odd_last[(key, t)] = at
        odd_rows = np.flatnonzero(odd)
        ends = np.searchsorted(ts, ts[odd_rows] + LIBRARY_BURST_NS, side="right")
        after = _nearest(thread.__getitem__, len(thread), odd_rows, ends, ahead=True)
        outside[after[after >= 0]] = True
        for i in odd_rows[(after < 0) & (ends == len(ts))].tolist():  # its thread's last, to carry
            self.odd_last[(int(pair[i]), int(tid[i]))] = int(ts[i])
        mapped = b.calls["api"][rows] == self.map_code if "api" in b.calls else np.zeros(len(rows), bool)
        return rows, pair_code, pairs, outside.astype("int64") * OUTSIDE + mapped.astype("int64") * MAPPED


def _nearest(thread_at: Callable[[np.ndarray], np.ndarray], n: int, rows: np.ndarray, bounds: np.ndarray,
             ahead: bool, widest: int = 512) -> np.ndarray:
    """The position of each of `rows`' nearest of the same thread number, ahead of it up to its
    bound (exclusive) when `ahead`, else behind it down to its bound (inclusive); -1 for none.
    `thread_at(positions)`: the thread numbers at positions of 0..n-1 (-1: none, a row never
    matched). A few positions at a time, doubling; those not found within `widest` positions (or
    too many to look at so) from every position of their span at once (previous_in_group, over
    the span reversed when looking ahead)."""
    step = 1 if ahead else -1
    found = np.full(len(rows), -1, "int64")
    own = thread_at(rows)
    todo, start, width = np.arange(len(rows)), rows + step, 8
    while len(todo) and width <= widest and len(todo) * width <= LOOK_BACK_ROWS:
        at = start[todo, None] + step * np.arange(width)
        inside = at < bounds[todo, None] if ahead else at >= bounds[todo, None]
        match = inside & (thread_at(np.clip(at, 0, n - 1)) == own[todo, None])
        hit = match.any(axis=1)
        found[todo[hit]] = at[hit, match[hit].argmax(axis=1)]
        start[todo] += step * width
        todo = todo[~hit & ((start[todo] < bounds[todo]) if ahead else (start[todo] >= bounds[todo]))]
        width *= 2
    if len(todo):
        a, z = (int(rows[todo].min()), int(bounds[todo].max())) if ahead else \
            (int(bounds[todo].min()), int(rows[todo].max()) + 1)
        code = pd.factorize(thread_at(np.arange(a, z)))[0][::-step]  # ahead: the span reversed
        near = previous_in_group(code, int(code.max()) + 1)[::-step]  # by position in the span
        if ahead:  # a position in the span reversed
            near = np.where(near >= 0, len(code) - 1 - near, -1)
        near = np.where(near >= 0, near + a, -1)[rows[todo] - a]
        found[todo] = np.where((near >= 0) & ((near < bounds[todo]) if ahead else (near >= bounds[todo])), near, -1)
    return found


class OutsideRows:
    """AllocatorRows' OUTSIDE bit of chosen allocations only (ByteClassSums reads it of the few
    kept after the last step or live after a batch, not of 5 million at 1e7 events): an odd size,
    or the allocation before it on its thread odd and at most LIBRARY_BURST_NS before. That
    allocation, when it can matter, is among the rows of the LIBRARY_BURST_NS before the chosen
    one, looked for backwards a few rows at a time; a thread's last allocation is carried to the
    next batch while a later one can be within LIBRARY_BURST_NS of it."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[bool, int]] = {}  # thread number (_thread_at) -> (odd, ts) of its last

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
            previous = _nearest(partial(_thread_at, b), len(b), i, lo, ahead=False)
            has = previous >= 0
            outside[judged[has]] = b.bytes[previous[has]] % SEGMENT_ALIGN != 0
            # none in the batch, the window reaching back before its first row: the thread's
            # last allocation of an earlier batch
            for k in np.flatnonzero(~has & (lo == 0)).tolist():
                carried = self.last.get(int(_thread_at(b, i[k:k + 1])[0]))
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
        # the allocations of the batch's last LIBRARY_BURST_NS, in order: a thread's last stays
        for thread, odd, ts in zip(_thread_at(b, rows).tolist(), (b.bytes[rows] % SEGMENT_ALIGN != 0).tolist(),
                                   b.ts[rows].tolist()):
            self.last[thread] = (odd, ts)


def _judged(b, rows) -> np.ndarray:
    """Whether each row is one AllocatorRows judges: a device allocation outside pools."""
    return b.is_alloc[rows] & (b.kind[rows] == DEVICE) & ~b.pool[rows]


def _thread_at(b, rows: np.ndarray) -> np.ndarray:
    """The thread number of each of the batch's `rows` ((process, device) and thread), -1 for a row
    AllocatorRows does not judge."""
    number = (pair_key(b.pid[rows], b.device[rows]) << 32) | (b.calls["tid"][rows].astype("int64") & 0xFFFFFFFF)
    return np.where(_judged(b, rows), number, -1)


# positions looked at by _nearest at a time (its temporaries are a few bytes each), then all at once
LOOK_BACK_ROWS = 1 << 20


class AllocatorSums(Reducer):
    """What `reserved.allocators` is made of, per (process, device): the first look counts what
    recognizing its allocator reads (COUNTS); the second sums the live bytes of each class of
    allocation (OUTSIDE, MAPPED, BLOCK: the pair's preallocated block), read right after its
    peak's time and at the end, and counts each class. `uses` makes the AllocatorUse list.

    Facts: `api_names` (the names of the batches' API codes; without them, as --quick reads no
    calls, nothing is judged), `allocator_blocks` (pair key -> (time, bytes) of its preallocated
    block, known between the looks) and `allocator_peaks()`: (pid, device, time) of each
    process's peak so far, read on the second look after the peaks' look at the batch (`peaks`:
    the flow raises them as it goes; the whole frame's are known before the events). A batch
    that is the whole of the events (the whole frame's) is judged once: its first look's
    judgment is kept for its second."""

    field = "allocators"
    needs = ("api_names", "allocator_blocks", "allocator_peaks", "peaks")
    second_look = True

    def start(self, facts) -> None:
        super().start(facts)
        self.names = facts.more.get("api_names")
        self.counts = np.zeros((0, len(COUNTS)), "int64")  # by pair code: COUNTS
        self.keys: list[int] = []  # the pair keys seen, numbered in order (pair codes)
        self.code_of: dict[int, int] = {}  # pair key -> its code
        self.judged: Optional[_Judged] = None  # the last batch's judgment on the first look
        self._restart()

    def add(self, b) -> None:
        if self.names is not None:
            self.judged = self._judge(b, count=True)

    def _judge(self, b, count: bool = False) -> "_Judged":
        """The class bits and pair code of each of the batch's judged rows (AllocatorRows), counted
        (COUNTS) on the first look."""
        judged = _Judged(b)
        for at, part in _slices(b):
            rows, local, pairs, bits = self.rows.of(part)
            code = self._codes(local, pairs)
            if count:
                self._count(part, rows, code, bits)
            rows += at
            judged.cls[rows], judged.code[rows] = bits, code
        return judged

    def _codes(self, local: np.ndarray, distinct: np.ndarray) -> np.ndarray:
        """The pair code of each row, from its number `local` among the `distinct` pair keys (new
        keys numbered as they come; AllocatorRows.of has numbered them)."""
        for key in distinct.tolist():  # a few (process, device) pairs
            if key not in self.code_of:
                self.code_of[key] = len(self.keys)
                self.keys.append(key)
        grow = len(self.keys) - len(self.counts)  # a row of each table for each new pair
        self.counts, self.sums, self.classes = (np.vstack([t, np.zeros((grow, t.shape[1]), "int64")])
                                                for t in (self.counts, self.sums, self.classes))
        return np.array([self.code_of[key] for key in distinct.tolist()], "int64")[local]

    def _count(self, b, rows: np.ndarray, code: np.ndarray, bits: np.ndarray) -> None:
        if len(rows):
            size = b.bytes[rows]
            # each row's cell: (a map, a segment, neither) x (2 MiB, 20 MiB, unaligned, another
            # size), counted at once per pair; COUNTS are sums of cells (seven masked counts
            # took twice as long)
            how = np.where((bits & MAPPED) != 0, 0, np.where((bits & OUTSIDE) == 0, 4, 8))
            how += np.where(size == SMALL_SEGMENT, 0, np.where(size == LARGE_SEGMENT, 1,
                                                               np.where((size & (SEGMENT_ALIGN - 1)) != 0, 2, 3)))
            how += code * 12
            cells = np.bincount(how, minlength=len(self.keys) * 12).reshape(-1, 12)
            mapped, segment = cells[:, 0:4], cells[:, 4:8]
            self.counts += np.stack([mapped.sum(axis=1), mapped[:, 2] + mapped[:, 3], mapped[:, 1],
                                     segment.sum(axis=1), segment[:, 2], segment[:, 0], segment[:, 1]], axis=1)

    def between(self) -> None:
        self._restart()  # judged again from the start

    def _restart(self) -> None:
        self.rows = AllocatorRows(self.names or [])
        self.sums = np.zeros((len(self.keys), 8), "int64")  # by pair code: live bytes per class
        self.classes = np.zeros((len(self.keys), 8), "int64")  # by pair code: allocations per class
        self.at_peak: dict[int, np.ndarray] = {}  # pair key -> live bytes per class right after its peak
        self.moments: dict[int, int] = {}  # pair key -> the time of its peak so far
        self.waiting: set = set()  # the pairs whose peak's split is not read yet
        # the allocations counted and not freed by the end of an earlier batch, seq in order
        self.live = {"seq": np.zeros(0, "int64"), "code": np.zeros(0, "int64"), "cls": np.zeros(0, "int64"),
                     "bytes": np.zeros(0, "int64")}

    def again(self, b) -> None:
        if self.names is not None:
            judged, self.judged = self.judged, None
            if judged is None or not judged.holds(b):
                judged = self._judge(b)  # not the one batch of the first look: judged again
            for at, part in _slices(b):
                rows = np.flatnonzero(judged.cls[at:at + SLICE_ROWS] >= 0)
                self._sum(part, at, judged, b.bytes, rows, judged.code[at + rows], judged.cls[at + rows])
            self._keep_unfreed(b, judged)

    def _sum(self, b, offset: int, summed: "_Judged", whole_bytes: np.ndarray, rows: np.ndarray, code: np.ndarray,
             bits: np.ndarray) -> None:
        """The changes of one slice `b` of a batch (its rows from `offset`, the judged ones `rows`
        with their pair `code` and class `bits`; the batch's bytes `whole_bytes`); `summed`: the
        batch's judgment, its allocations not freed so far (a free finds its allocation of this
        batch by its row, with no search: 0.2 s of 0.3 at 1e6 events), those of earlier batches in
        `live`."""
        blocks = self.facts.more["allocator_blocks"]
        for key, (ts, size) in blocks.items():  # a pair's preallocated block
            mine = self.code_of.get(key, -1)
            bits = bits | np.where((code == mine) & (b.ts[rows] == ts) & (b.bytes[rows] == size), BLOCK, 0)
        self.classes += np.bincount(code * 8 + bits, minlength=len(self.keys) * 8).reshape(-1, 8)
        if blocks:
            summed.cls[offset + rows] = bits  # with BLOCK
        # each change: an allocation counted (+), or the free of one (-), at its row in the slice
        frees = np.flatnonzero(b.partner_seq >= 0)
        partner = b.partner_seq[frees]
        here = partner >= summed.first
        # this batch's, by row
        row = summed.rows_of(partner[here])
        counted_here = summed.cls[row] >= 0
        freed, row = frees[here][counted_here], row[counted_here]
        cls_here, code_here = summed.cls[row].astype("int64"), summed.code[row].astype("int64")
        bytes_here = whole_bytes[row]
        summed.cls[row] = -1  # freed
        # an earlier batch's
        live, frees = self.live, frees[~here]
        at = np.minimum(np.searchsorted(live["seq"], partner[~here]), max(len(live["seq"]) - 1, 0))
        hit = live["seq"][at] == partner[~here] if len(live["seq"]) else np.zeros(len(frees), bool)
        frees, at = frees[hit], at[hit]
        position = np.concatenate([rows, freed, frees])
        change_code = np.concatenate([code, code_here, live["code"][at]])
        change_cls = np.concatenate([bits, cls_here, live["cls"][at]])
        change = np.concatenate([b.bytes[rows], -bytes_here, -live["bytes"][at]])
        for pid, device, ts in self.facts.more["allocator_peaks"]():  # a new or raised peak: read after its time
            key = one_pair_key(pid, device)
            if self.moments.get(key) != ts:
                self.moments[key] = ts
                self.waiting.add(key)
        for key in sorted(self.waiting):
            cut = int(np.searchsorted(b.ts, self.moments[key], side="right"))
            if cut < len(b.ts):  # the first event after the peak's time is in this batch
                mine = np.flatnonzero((change_code == self.code_of.get(key, -1)) & (position < cut))
                split = self._of(self.sums, key)
                np.add.at(split, change_cls[mine], change[mine])
                self.at_peak[key] = split
                self.waiting.discard(key)
        np.add.at(self.sums.reshape(-1), change_code * 8 + change_cls, change)
        if len(at):
            still = np.ones(len(live["seq"]), bool)
            still[at] = False  # freed in this slice
            self.live = {c: v[still] for c, v in live.items()}

    def _keep_unfreed(self, b, summed: "_Judged") -> None:
        """The batch's allocations counted and not freed in it join `live`, for later batches' frees."""
        rows = np.flatnonzero(summed.cls >= 0)
        if len(rows):
            kept = {"seq": b.seq[rows], "code": summed.code[rows], "cls": summed.cls[rows].astype("int64"),
                    "bytes": b.bytes[rows]}
            self.live = {c: np.concatenate([self.live[c], kept[c]]) for c in self.live}

    def finish(self, live: dict) -> "AllocatorSums":
        for key in self.waiting:  # no event after the peak's time: the end's
            self.at_peak[key] = self._of(self.sums, key)
        self.waiting = set()
        return self

    def _of(self, table: np.ndarray, key: int) -> np.ndarray:
        """A copy of a pair's row of a table by pair code (zeros for a pair not seen)."""
        code = self.code_of.get(key)
        return table[code].copy() if code is not None else np.zeros(table.shape[1], "int64")

    def recognized(self, pid: int, device: int, is_python: bool) -> Optional[str]:
        """pytorch_caching | pytorch_expandable for one (process, device)'s device allocations, or
        None: its maps all of 2 or 20 MiB, some of 20 MiB, three or more: expandable segments;
        else three or more segments, all 2 MiB multiples, some of 2 MiB and some of 20 MiB (or a
        Python process): the caching allocator."""
        key = one_pair_key(pid, device)
        c = dict(zip(COUNTS, self._of(self.counts, key).tolist()))
        if c["mapped"] >= 3 and not c["mapped_other"] and c["mapped_large"]:
            return "pytorch_expandable"
        if c["segments"] < 3 or c["unaligned"]:
            return None
        if c["small"] and (c["large"] or is_python):
            return "pytorch_caching"
        return None

    def uses(self, peaks: list[Peak], kind_of: Callable[[int, int], Optional[str]],
             preallocations: list[Preallocation], gpu_of: GpuOf, label: Callable[[int], str]) -> list[AllocatorUse]:
        """Inside/outside the framework allocator, at each process's peak and at the end;
        `kind_of(pid, device)`: its allocator (`recognized`, None for XLA's processes: never
        PyTorch's), unless it preallocated a block."""
        prealloc = {(p.pid, p.device): p for p in preallocations}
        found = []
        for pid, device in sorted({(p.pid, p.device) for p in peaks if p.pid is not None}):
            key = one_pair_key(pid, device)
            if (pid, device) in prealloc:
                kind = "xla_preallocation" if prealloc[(pid, device)].framework == "XLA" else "preallocation"
                inside = np.array([(c & BLOCK) != 0 for c in range(8)])
            else:
                kind = kind_of(pid, device)
                if kind is None:
                    continue
                # NCCL's and other libraries' VMM maps are not the caching allocator's
                outside = OUTSIDE | MAPPED if kind == "pytorch_caching" else OUTSIDE
                inside = np.array([(c & outside) == 0 for c in range(8)])
            zero = np.zeros(8, "int64")
            at_peak, end = self.at_peak.get(key, zero), self._of(self.sums, key)
            count = int(self._of(self.classes, key)[~inside].sum())
            inside_peak, outside_peak = int(at_peak[inside].sum()), int(at_peak[~inside].sum())
            found.append(AllocatorUse(
                pid=pid, device=device, gpu=gpu_of(pid, device), allocator=kind, inside_at_peak_bytes=inside_peak,
                outside_at_peak_bytes=outside_peak, inside_end_bytes=int(end[inside].sum()),
                outside_end_bytes=int(end[~inside].sum()), outside_allocations=count,
                message=_message(kind, label(pid), gpu_of(pid, device), device, inside_peak, outside_peak, count)))
        return found


def _slices(b) -> Iterator[tuple[int, SimpleNamespace]]:
    """The batch's rows SLICE_ROWS at a time (views), each with its first row: the whole frame's
    batch leaves bounded temporaries."""
    for a in range(0, len(b), SLICE_ROWS):
        yield a, SimpleNamespace(**{name: getattr(b, name)[a:a + SLICE_ROWS] for name in
                                    ("seq", "ts", "pid", "device", "kind", "is_alloc", "bytes", "pool",
                                     "partner_seq")},
                                 calls={name: values[a:a + SLICE_ROWS] for name, values in b.calls.items()})


class _Judged:
    """Per row of a batch, the class bits of the allocation judged there (-1: none, or freed since
    on the second look) and its pair code: 5 bytes a row, where a sorted list of the allocations
    searched by each free took a search per free."""

    def __init__(self, b) -> None:
        self.cls = np.full(len(b), -1, "int8")
        self.code = np.zeros(len(b), "int32")
        self.seq = b.seq
        self.first = int(b.seq[0]) if len(b) else 0
        # a batch numbers its rows one after another (the whole frame: 0..n-1): a row is a difference
        self.numbered = not len(b) or int(b.seq[-1]) - self.first == len(b) - 1

    def rows_of(self, seq: np.ndarray) -> np.ndarray:
        """The rows of the batch's `seq` (each at least its first)."""
        return seq - self.first if self.numbered else np.searchsorted(self.seq, seq)

    def holds(self, b) -> bool:
        """Whether `b` is the batch judged (the same first event, the same length)."""
        return (self.first, len(self.seq)) == (int(b.seq[0]) if len(b) else 0, len(b))


_NAMES = {"pytorch_caching": "PyTorch's caching allocator",
          "pytorch_expandable": "PyTorch's caching allocator (expandable segments, through cuMemCreate/cuMemMap/"
                                "cuMemSetAccess)",
          "xla_preallocation": "XLA's allocator", "preallocation": "a preallocating allocator"}


def _message(kind: str, who: str, gpu: Optional[int], device: int, inside: int, outside: int,
             outside_count: int) -> str:
    where = f"GPU {gpu}" if gpu is not None else f"device {device}"
    text = (f"{who} on {where}: {_NAMES[kind]} held {fmt_bytes(inside)} at the peak. These bytes are what "
            "it reserved from the driver; its tensors use less, and what they use is not in an nsys trace")
    if kind.startswith("pytorch"):
        text += (" (torch.cuda.memory_allocated() tells). 'Never freed' at exit is its cache, not a leak; "
                 "growth from step to step is the signal")
    if outside_count:
        text += (f". {fmt_bytes(outside)} was allocated outside it ({outside_count} allocations: library "
                 "workspaces and buffers, such as cuBLAS's and NCCL's, made directly with cudaMalloc or the "
                 "virtual-memory API)")
    return text + "."
