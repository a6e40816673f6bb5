"""The memory pools (pools.pool_uses) over the flow of event batches, in bounded memory.

Each batch carries the pool rows of its timestamps (`EventBatch.pools`); the pools' creations,
trims and destructions (a small table, read whole) are merged in at their time, after the pool
rows of the same moment, the order pool_uses sorts them in. The first look counts each pool's
points and sums its highest reserve and hand-outs, its last reserve and its trims. The second,
knowing each pool's count, downsamples its series into pool_uses' buckets (the highest reserve
and the last point of each) and hands the changes of the pools' unused reserve to the peaks,
batch by batch. Only per-pool sums, the kept points and the changes not yet added stay in memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..events.arrays import distinct_rows
from ..events.stream import EventBatch
from ..model import PoolUse
from . import pools as pool_rules
from .streamed import HIGH, LOW, pair_key, running_sums

OPERATIONS = {"created": 1, "destroyed": 2, "trimmed": 3}  # 0: a pool allocation or free


@dataclass
class PoolPoints:
    """Every pool's points in pool_uses' order, batch by batch: the batch's pool rows, then the
    lifecycle rows (read_pool_events) up to the batch's last time; each pool numbered in order of
    first appearance (`index`, shared by both looks)."""

    lifecycle: pd.DataFrame
    index: dict = field(default_factory=dict)
    taken: int = 0

    def __post_init__(self) -> None:
        life = self.lifecycle.sort_values("ts_ns", kind="stable")
        operation = life["operation"].map(OPERATIONS).fillna(0).to_numpy().astype("int64")
        self.life = {"ts": life["ts_ns"].to_numpy().astype("int64"), "pid": life["pid"].to_numpy().astype("int64"),
                     "device": life["device"].to_numpy().astype("int64"),
                     "address": life["address"].to_numpy().astype("int64"), "used_delta": np.zeros(len(life), "int64"),
                     "reserved": np.where(operation == OPERATIONS["destroyed"], 0,
                                          np.maximum(life["reserved"].to_numpy().astype("int64"), 0)),
                     "operation": operation}

    def of(self, b: Optional[EventBatch]) -> dict:
        """The points of batch `b` (of the lifecycle rows left after the last batch when None),
        with each pool's code. A later batch starts after every time of this one (stream.py)."""
        rows = b.pools if b is not None and b.pools and len(b.pools["ts_ns"]) else None
        end = len(self.life["ts"])
        if b is not None:
            until = max(int(b.ts[-1]) if len(b) else LOW, int(rows["ts_ns"][-1]) if rows is not None else LOW)
            end = int(np.searchsorted(self.life["ts"], until, side="right"))
        life = {name: values[self.taken:end] for name, values in self.life.items()}
        self.taken = max(end, self.taken)
        if rows is not None:
            usage = {"ts": rows["ts_ns"].astype("int64"), "pid": rows["pid"].astype("int64"),
                     "device": rows["device"].astype("int64"), "address": rows["address"].astype("int64"),
                     "used_delta": np.where(rows["is_alloc"], rows["bytes"], -rows["bytes"]).astype("int64"),
                     "reserved": rows["reserved"].astype("int64"), "operation": np.zeros(len(rows["ts_ns"]), "int64")}
            merged = {name: np.concatenate([usage[name], life[name]]) for name in life}
            order = np.argsort(merged["ts"], kind="stable")  # pool rows first at equal times
            life = {name: values[order] for name, values in merged.items()}
        if not len(life["ts"]):
            return {**life, "code": np.zeros(0, "int64")}
        # hashed a column at a time: a MultiIndex of the pool rows took 1.4 s of a 1e7-event stream
        slot, first = distinct_rows(life["pid"], life["device"], life["address"])
        codes = [self.index.setdefault(key, len(self.index)) for key in zip(
            life["pid"][first].tolist(), life["device"][first].tolist(), life["address"][first].tolist())]
        return {**life, "code": np.array(codes, "int64")[slot]}


def _grown(values: np.ndarray, size: int, fill: int) -> np.ndarray:
    return values if len(values) >= size else np.concatenate([values, np.full(size - len(values), fill, "int64")])


def _last_rows(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each code present and the row of its last occurrence."""
    distinct, from_end = np.unique(codes[::-1], return_index=True)
    return distinct, len(codes) - 1 - from_end


def _steps(codes: np.ndarray, values: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """Each value minus the one before it of the same code (`carry[code]` before the first);
    `carry` is left holding each code's last value."""
    if not len(codes):
        return np.zeros(0, "int64")
    order = np.argsort(codes, kind="stable")
    in_order, sorted_codes = values[order], codes[order]
    before = np.concatenate([[0], in_order[:-1]])
    starts = np.flatnonzero(np.concatenate([[True], sorted_codes[1:] != sorted_codes[:-1]]))
    before[starts] = carry[sorted_codes[starts]]
    carry[sorted_codes[starts]] = in_order[np.append(starts[1:], len(order)) - 1]
    steps = np.empty_like(in_order)
    steps[order] = in_order - before
    return steps


@dataclass
class PoolSums:
    """The first look at the pools: per pool, its points, hand-outs, highest and last reserve."""

    lifecycle: pd.DataFrame
    points: PoolPoints = field(init=False)
    sums: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.points = PoolPoints(self.lifecycle)
        self.fill = {"count": 0, "used": 0, "peak_used": LOW, "peak_reserved": LOW, "end_reserved": 0, "trims": 0,
                     "created": HIGH, "destroyed": LOW}
        self.sums = {name: np.zeros(0, "int64") for name in self.fill}

    def add(self, b: Optional[EventBatch]) -> None:
        """Batch `b`'s points (None: the lifecycle rows after the last batch)."""
        p = self.points.of(b)
        codes = p["code"]
        if not len(codes):
            return
        s = self.sums = {name: _grown(values, len(self.points.index), self.fill[name])
                         for name, values in self.sums.items()}
        used = running_sums(codes, p["used_delta"], s["used"])
        np.maximum.at(s["peak_used"], codes, used)
        np.maximum.at(s["peak_reserved"], codes, p["reserved"])
        present, last = _last_rows(codes)
        s["end_reserved"][present] = p["reserved"][last]
        np.add.at(s["count"], codes, 1)
        np.add.at(s["trims"], codes, (p["operation"] == OPERATIONS["trimmed"]).astype("int64"))
        created, destroyed = p["operation"] == OPERATIONS["created"], p["operation"] == OPERATIONS["destroyed"]
        np.minimum.at(s["created"], codes[created], p["ts"][created])  # the points are in time order
        np.maximum.at(s["destroyed"], codes[destroyed], p["ts"][destroyed])

    def finish(self) -> None:
        self.add(None)

    def counted(self) -> np.ndarray:
        """Whether each pool's unused reserve counts in the peaks (pool_uses: it handed something
        out and its reserve was recorded)."""
        return (self.sums["peak_used"] > 0) & (self.sums["peak_reserved"] > 0)


@dataclass
class PoolSeries:
    """The second look at the pools: each pool's downsampled series, and the changes of the
    unused reserve of the counted pools of the `watched` (process, device) pair keys, added to
    `changes` (SecondLook's) batch by batch: pair key -> (ts, bytes, how many the peaks took)."""

    first: PoolSums
    watched: set
    changes: dict = field(default_factory=dict)
    points: PoolPoints = field(init=False)
    kept: list = field(default_factory=list)  # frames of (code, row, bucket, ts, reserved, used)

    def __post_init__(self) -> None:
        size = len(self.first.points.index)
        self.points = PoolPoints(self.first.lifecycle, index=dict(self.first.points.index))
        self.seen, self.used, self.unused = (np.zeros(size, "int64") for _ in range(3))
        self.counted = self.first.counted()

    def add(self, b: Optional[EventBatch]) -> None:
        p = self.points.of(b)
        codes = p["code"]
        if not len(codes):
            return
        row = running_sums(codes, np.ones(len(codes), "int64"), self.seen) - 1
        used = running_sums(codes, p["used_delta"], self.used)
        used = np.maximum(used, 0)
        self._keep(codes, row, p["ts"], p["reserved"], used)
        # pool_uses' changes: the unused reserve (never below 0) and its step at each point
        counted = np.flatnonzero(self.counted[codes])
        unused = np.maximum(p["reserved"][counted] - used[counted], 0)  # `used` here is never below 0
        self._queue(p["ts"][counted], pair_key(p["pid"][counted], p["device"][counted]),
                    _steps(codes[counted], unused, self.unused))

    def _queue(self, ts: np.ndarray, pairs: np.ndarray, amounts: np.ndarray) -> None:
        """A batch's changes after those the peaks have not taken yet (no later batch has a change
        before this one's); only for watched pairs, so that none waits for ever."""
        for pair in pd.unique(pairs).tolist():
            if pair not in self.watched:
                continue
            mine = pairs == pair
            old_ts, old_bytes, taken = self.changes.get(pair, (np.zeros(0, "int64"), np.zeros(0, "int64"), 0))
            self.changes[pair] = (np.concatenate([old_ts[taken:], ts[mine]]),
                                  np.concatenate([old_bytes[taken:], amounts[mine]]), 0)

    def finish(self) -> None:
        self.add(None)

    def _keep(self, codes: np.ndarray, row: np.ndarray, ts: np.ndarray, reserved: np.ndarray,
              used: np.ndarray) -> None:
        """pools._downsampled's points among these: every point of a pool of MAX_POINTS or fewer,
        else the first highest reserve and the last point of each of its buckets here."""
        most = pool_rules.MAX_POINTS
        count = self.first.sums["count"][codes]
        buckets = np.where(count > most, np.minimum((row * most // 2) // np.maximum(count, 1), most // 2 - 1), -1)
        frame = pd.DataFrame({"code": codes, "row": row, "bucket": buckets, "ts": ts, "reserved": reserved,
                              "used": used})
        whole = frame[buckets < 0]
        split = frame[buckets >= 0]
        if len(split):
            per = split.groupby(["code", "bucket"], sort=False)
            split = split.loc[np.unique(np.concatenate([per["reserved"].idxmax().to_numpy(),
                                                        per["row"].idxmax().to_numpy()]))]
        self.kept.append(pd.concat([whole, split]))

    def uses(self, gpu_of: Callable[[int, int], Optional[int]]) -> list[PoolUse]:
        """pool_uses' PoolUse of every pool, in (process, device, address) order."""
        if not self.first.points.index:
            return []
        kept = pd.concat(self.kept, ignore_index=True)
        kept = kept.sort_values(["code", "row"], kind="stable")
        life = self.first.lifecycle
        types = dict(zip(zip(life["pid"], life["device"], life["address"]), life["pool_type"]))
        s = self.first.sums
        found = []
        for (pid, device, address), code in sorted(self.first.points.index.items()):
            mine = kept[kept["code"].to_numpy() == code]
            if (mine["bucket"] >= 0).any():  # per bucket: the first highest reserve and the last point
                by_bucket = mine.groupby("bucket", sort=False)
                chosen = np.unique(np.concatenate([
                    mine.loc[by_bucket["reserved"].idxmax(), "row"].to_numpy(), by_bucket["row"].max().to_numpy()]))
                mine = mine[mine["row"].isin(chosen)].drop_duplicates("row")
            created, destroyed = int(s["created"][code]), int(s["destroyed"][code])
            found.append(PoolUse(
                pid=pid, device=device, gpu=gpu_of(pid, device), address=address,
                pool_type=str(types.get((pid, device, address), "")),
                created_ns=created if created != HIGH else None,
                peak_reserved_bytes=int(s["peak_reserved"][code]), peak_used_bytes=int(max(s["peak_used"][code], 0)),
                end_reserved_bytes=int(s["end_reserved"][code]), trims=int(s["trims"][code]),
                destroyed_ns=destroyed if destroyed != LOW else None,
                ts_ns=mine["ts"].astype("int64").tolist(), reserved_bytes=mine["reserved"].astype("int64").tolist(),
                used_bytes=mine["used"].astype("int64").tolist()))
        return found
