"""Stream-ordered memory pools (cudaMallocAsync): what each pool reserved, next to what it handed out.

A pool takes memory from the driver in chunks (32 MiB for the default pool's first 8 MiB block on
known_mem_v25) and keeps it until trimmed (`cudaMemPoolTrimTo`, or its release threshold at a
synchronize), so the GPU holds the pool's reserve, not the sum of its live blocks. nsys writes the
reserve on each pool allocation and free (`localMemoryPoolSize`) and on each pool's creation, trim
and destruction (CUDA_GPU_MEMORY_POOL_EVENTS). The reserve is counted in the GPU-resident peak: as
an adjustment of the events' live bytes (the pool's unused reserve), attached to the next event of
the same process and device at or after each change.

One reducer (`PoolUses`) answers on both paths. Each batch carries the pool rows of its timestamps
(`EventBatch.pools`; the whole frame's are one batch's); the pools' creations, trims and
destructions (a small table, read whole: `Facts.more["pool_events"]`) are merged in at their time,
after the pool rows of the same moment. The first look counts each pool's points and sums its
highest reserve and hand-outs, its last reserve and its trims. The second, knowing each pool's
count, downsamples its series into buckets (the highest reserve and the last point of each) and
queues the changes of the pools' unused reserve for the peaks, batch by batch. Only per-pool sums,
the kept points and the changes not yet taken stay in memory.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pandas as pd

from ..engine import Facts, Reducer
from ..events.arrays import HIGH, LOW, distinct_rows, pair_key, previous_in_group, running_sums
from ..events.read_pools import empty_pool_events
from ..events.batch import EventBatch
from ..model import PoolUse
from .timeline import bucket_ends

MAX_POINTS = 2000
OPERATIONS = {"created": 1, "destroyed": 2, "trimmed": 3}  # 0: a pool allocation or free
# the pools' sums of the first look, and what each starts from
FIRST = {"count": 0, "used": 0, "peak_used": LOW, "peak_reserved": LOW, "end_reserved": 0, "trims": 0,
         "created": HIGH, "destroyed": LOW}


class PoolUses(Reducer):
    """`reserved.pools`: each pool's reserve and hand-outs over time (PoolUse, in (process,
    device, address) order). Between the looks, `watch` names the (process, device) pair keys
    whose reserve changes the peaks take (all when never called); the second look queues them in
    `changes`: pair key -> (times, bytes, how many the peaks took), each pair's in time order."""

    field = "pools"
    needs = ("pool_events",)
    second_look = True

    def start(self, facts: Facts) -> None:
        super().start(facts)
        life = facts.more.get("pool_events", empty_pool_events()).sort_values("ts_ns", kind="stable")
        operation = life["operation"].map(OPERATIONS).fillna(0).to_numpy().astype("int64")
        self.lifecycle = life
        self.life = {"ts": life["ts_ns"].to_numpy().astype("int64"), "pid": life["pid"].to_numpy().astype("int64"),
                     "device": life["device"].to_numpy().astype("int64"),
                     "address": life["address"].to_numpy().astype("int64"), "used_delta": np.zeros(len(life), "int64"),
                     "reserved": np.where(operation == OPERATIONS["destroyed"], 0,
                                          np.maximum(life["reserved"].to_numpy().astype("int64"), 0)),
                     "operation": operation}
        self.index: dict = {}  # (pid, device, address) -> the pool's code, in order of first appearance
        self.taken = 0  # lifecycle rows merged so far in this look
        self.sums = {name: np.zeros(0, "int64") for name in FIRST}
        self.watched: Optional[set] = None
        self.changes: dict = {}
        self.looked = False  # the first look's sums complete

    def add(self, b: EventBatch) -> None:
        self._sum(self._points(b))

    def watch(self, pairs: set) -> None:
        self.watched = pairs

    def between(self) -> None:
        if not self.looked:  # once: the second look may start over (events/stream.py)
            self._sum(self._points(None))
            self.looked = True
        size = len(self.index)
        self.taken, self.changes, self.kept = 0, {}, []  # kept: the points kept, batch by batch
        self.seen, self.used, self.unused = (np.zeros(size, "int64") for _ in range(3))
        # whose unused reserve counts in the peaks: a pool that never handed anything out does not
        # (whether the driver backed its size is not visible), nor one whose size was not recorded
        # (NULL: reserve 0)
        self.counted = (self.sums["peak_used"] > 0) & (self.sums["peak_reserved"] > 0)

    def again(self, b: EventBatch) -> None:
        self._series(self._points(b))

    def finish(self, live: dict) -> list[PoolUse]:
        self._series(self._points(None))
        return self._uses()

    def _points(self, b: Optional[EventBatch]) -> dict:
        """The points of batch `b` (of the lifecycle rows left after the last batch when None), in
        time order, the pool rows first at equal times, with each pool's code. A later batch
        starts after every time of this one (stream.py)."""
        rows = b.pools if b is not None and b.pools and len(b.pools["ts_ns"]) else None
        end = len(self.life["ts"])
        if b is not None:
            until = max(int(b.ts[-1]) if len(b) else LOW, int(rows["ts_ns"][-1]) if rows is not None else LOW)
            end = int(np.searchsorted(self.life["ts"], until, side="right"))
        points = {name: values[self.taken:end] for name, values in self.life.items()}
        self.taken = max(end, self.taken)
        if rows is not None:
            usage = {"ts": rows["ts_ns"].astype("int64"), "pid": rows["pid"].astype("int64"),
                     "device": rows["device"].astype("int64"), "address": rows["address"].astype("int64"),
                     "used_delta": np.where(rows["is_alloc"], rows["bytes"], -rows["bytes"]).astype("int64"),
                     "reserved": rows["reserved"].astype("int64"), "operation": np.zeros(len(rows["ts_ns"]), "int64")}
            merged = {name: np.concatenate([usage[name], points[name]]) for name in points}
            order = np.argsort(merged["ts"], kind="stable")  # pool rows first at equal times
            points = {name: values[order] for name, values in merged.items()}
        if not len(points["ts"]):
            return {**points, "code": np.zeros(0, "int64")}
        # hashed a column at a time: a MultiIndex of the pool rows took 1.4 s of a 1e7-event stream
        slot, first = distinct_rows(points["pid"], points["device"], points["address"])
        codes = [self.index.setdefault(key, len(self.index)) for key in zip(
            points["pid"][first].tolist(), points["device"][first].tolist(), points["address"][first].tolist())]
        return {**points, "code": np.array(codes, "int64")[slot]}

    def _sum(self, p: dict) -> None:
        """The first look at points `p`: per pool, its points, hand-outs, highest and last reserve."""
        codes = p["code"]
        if not len(codes):
            return
        s = self.sums = {name: _grown(values, len(self.index), FIRST[name]) for name, values in self.sums.items()}
        used = running_sums(codes, p["used_delta"], s["used"])
        np.maximum.at(s["peak_used"], codes, used)
        np.maximum.at(s["peak_reserved"], codes, p["reserved"])
        distinct, from_end = np.unique(codes[::-1], return_index=True)
        s["end_reserved"][distinct] = p["reserved"][len(codes) - 1 - from_end]  # each pool's last point
        np.add.at(s["count"], codes, 1)
        np.add.at(s["trims"], codes, (p["operation"] == OPERATIONS["trimmed"]).astype("int64"))
        created, destroyed = p["operation"] == OPERATIONS["created"], p["operation"] == OPERATIONS["destroyed"]
        np.minimum.at(s["created"], codes[created], p["ts"][created])  # the points are in time order
        np.maximum.at(s["destroyed"], codes[destroyed], p["ts"][destroyed])

    def _series(self, p: dict) -> None:
        """The second look at points `p`: the points kept of each pool's series, and the changes
        of the counted pools' unused reserve (never below 0) queued for the peaks."""
        codes = p["code"]
        if not len(codes):
            return
        row = running_sums(codes, np.ones(len(codes), "int64"), self.seen) - 1
        used = np.maximum(running_sums(codes, p["used_delta"], self.used), 0)
        self._keep(codes, row, p["ts"], p["reserved"], used)
        counted = np.flatnonzero(self.counted[codes])
        unused = np.maximum(p["reserved"][counted] - used[counted], 0)
        self._queue(p["ts"][counted], pair_key(p["pid"][counted], p["device"][counted]),
                    _steps(codes[counted], unused, self.unused))

    def _queue(self, ts: np.ndarray, pairs: np.ndarray, amounts: np.ndarray) -> None:
        """A batch's changes after those the peaks have not taken yet (no later batch has a change
        before this one's); only for watched pairs, so that none waits for ever."""
        for pair in pd.unique(pairs).tolist():
            if self.watched is not None and pair not in self.watched:
                continue
            mine = pairs == pair
            old_ts, old_bytes, taken = self.changes.get(pair, (np.zeros(0, "int64"), np.zeros(0, "int64"), 0))
            self.changes[pair] = (np.concatenate([old_ts[taken:], ts[mine]]),
                                  np.concatenate([old_bytes[taken:], amounts[mine]]), 0)

    def _keep(self, codes: np.ndarray, row: np.ndarray, ts: np.ndarray, reserved: np.ndarray,
              used: np.ndarray) -> None:
        """The points that may survive the downsampling among these: every point of a pool of
        MAX_POINTS or fewer, else the first highest reserve and the last point of each of its
        buckets here."""
        count = self.sums["count"][codes]
        split = count > MAX_POINTS
        bucket = np.where(split, np.minimum((row * MAX_POINTS // 2) // np.maximum(count, 1), MAX_POINTS // 2 - 1), -1)
        keep = np.flatnonzero(~split)
        if split.any():
            cut = np.flatnonzero(split)
            keep = np.union1d(keep, cut[_bucket_ends(codes[cut] * MAX_POINTS + bucket[cut], reserved[cut])])
        self.kept.append({"code": codes[keep], "row": row[keep], "bucket": bucket[keep], "ts": ts[keep],
                          "reserved": reserved[keep], "used": used[keep]})

    def _uses(self) -> list[PoolUse]:
        """Every pool's PoolUse, in (process, device, address) order: a series of more than
        MAX_POINTS points keeps, per time bucket, its first highest reserve and its last point."""
        if not self.index:
            return []
        kept = {name: np.concatenate([k[name] for k in self.kept]) for name in self.kept[0]}
        order = np.lexsort((kept["row"], kept["code"]))
        kept = {name: values[order] for name, values in kept.items()}
        edges = np.searchsorted(kept["code"], np.arange(len(self.index) + 1))
        life = self.lifecycle
        types = dict(zip(zip(life["pid"], life["device"], life["address"]), life["pool_type"]))
        s = self.sums
        found = []
        for (pid, device, address), code in sorted(self.index.items()):
            mine = np.arange(edges[code], edges[code + 1])
            if (kept["bucket"][mine] >= 0).any():
                mine = mine[_bucket_ends(kept["bucket"][mine], kept["reserved"][mine])]
            created, destroyed = int(s["created"][code]), int(s["destroyed"][code])
            found.append(PoolUse(
                pid=pid, device=device, gpu=self.facts.gpu_of(pid, device), address=address,
                pool_type=str(types.get((pid, device, address), "")),
                created_ns=created if created != HIGH else None,
                peak_reserved_bytes=int(s["peak_reserved"][code]), peak_used_bytes=int(max(s["peak_used"][code], 0)),
                end_reserved_bytes=int(s["end_reserved"][code]), trims=int(s["trims"][code]),
                destroyed_ns=destroyed if destroyed != LOW else None, ts_ns=kept["ts"][mine].tolist(),
                reserved_bytes=kept["reserved"][mine].tolist(), used_bytes=kept["used"][mine].tolist()))
        return found


def _bucket_ends(key: np.ndarray, reserved: np.ndarray) -> np.ndarray:
    """The positions, ascending, of the first highest reserve and the last point of each `key`
    (a pool's bucket; the points in time order)."""
    order = np.argsort(key, kind="stable")
    return np.unique(order[bucket_ends(reserved[order], key[order])])


def _grown(values: np.ndarray, size: int, fill: int) -> np.ndarray:
    return values if len(values) >= size else np.concatenate([values, np.full(size - len(values), fill, "int64")])


def _steps(codes: np.ndarray, values: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Each value minus the one before it of the same code (`carry[code]` before the first);
    `carry` is left holding each code's last value."""
    previous = previous_in_group(codes, len(carry))
    before = np.where(previous >= 0, values[np.maximum(previous, 0)], carry[codes])
    distinct, from_end = np.unique(codes[::-1], return_index=True)
    carry[distinct] = values[len(codes) - 1 - from_end]  # each code's last value
    return values - before


def reached_before(slot: np.ndarray, when: np.ndarray, amount: np.ndarray, increment: np.ndarray,
                   row_ts: np.ndarray) -> np.ndarray:
    """For each row the changes are attached to (`slot`: each change's row; `when`, `amount`: its
    time and bytes; `increment`: the row's whole rise, its changes and its own bytes): the time of
    the earliest of its changes by which the row's level was already reached, -1 when only at the
    row itself. A pool created with its reserve inside a cudaMallocAsync holds it from its
    creation, while the allocation's event comes at the end of the call, 8.6 ms later on
    known_mem_v25: the peak it makes was reached at the creation."""
    reached = np.full(len(increment), -1, "int64")
    if not len(slot):
        return reached
    # one pass over every change (a pool-heavy capture has one per pool event): sorted by row then
    # time, each row's running sum is the overall one less what came before the row's first
    order = np.lexsort((when, slot))
    rows, when, amount = slot[order], when[order], amount[order]
    running = np.cumsum(amount)
    first = np.r_[True, rows[1:] != rows[:-1]]
    before = (running - amount)[first]  # the running sum before each row's first change
    prefix = running - before[np.cumsum(first) - 1]
    hit = np.flatnonzero((prefix >= increment[rows]) & (when < row_ts[rows]) & (increment[rows] > 0))
    if len(hit):
        hit_rows, at = np.unique(rows[hit], return_index=True)  # each row's earliest change that did
        reached[hit_rows] = when[hit[at]]
    return reached
