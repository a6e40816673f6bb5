"""Stream-ordered memory pools (cudaMallocAsync): what each pool reserved, next to what it handed out.

A pool takes memory from the driver in chunks (32 MiB for the default pool's first 8 MiB block on
known_mem_v25) and keeps it until trimmed (`cudaMemPoolTrimTo`, or its release threshold at a
synchronize), so the GPU holds the pool's reserve, not the sum of its live blocks. nsys writes the
reserve on each pool allocation and free (`localMemoryPoolSize`) and on each pool's creation, trim
and destruction (CUDA_GPU_MEMORY_POOL_EVENTS). The reserve is counted in the GPU-resident peak: as
an adjustment of the events' live bytes (the pool's unused reserve), attached to the next event of
the same process and device at or after each change.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..model import GPU_RESIDENT_KINDS, PoolUse

MAX_POINTS = 2000
# pool reserve changes: event rows (sorted, distinct), the bytes added at each, and when the
# level of each row was first reached (ns; -1: at the row's own time; see reached_before)
ReserveChanges = tuple[np.ndarray, np.ndarray, np.ndarray]

# pool rows (events.read_pools.pool_usage): ts_ns, pid, device, address, is_alloc, bytes, reserved
# pool events (events.read_pools.read_pool_events): ts_ns, pid, device, address, operation
# (created | destroyed | trimmed | ""), pool_type, reserved


def pool_uses(usage: pd.DataFrame, lifecycle: pd.DataFrame,
              gpu_of: Callable[[int, int], Optional[int]]) -> tuple[list[PoolUse], pd.DataFrame]:
    """Each pool's reserve and hand-outs over time, and the changes of the unused reserve of the
    pools that handed something out: a frame of (ts_ns, pid, device, delta_bytes)."""
    if usage.empty and lifecycle.empty:
        return [], _no_changes()
    points = pd.concat([
        pd.DataFrame({"ts_ns": usage["ts_ns"], "pid": usage["pid"], "device": usage["device"],
                      "address": usage["address"], "used_delta": np.where(usage["is_alloc"], usage["bytes"],
                                                                          -usage["bytes"]),
                      "reserved": usage["reserved"], "operation": ""}),
        pd.DataFrame({"ts_ns": lifecycle["ts_ns"], "pid": lifecycle["pid"], "device": lifecycle["device"],
                      "address": lifecycle["address"], "used_delta": 0,
                      "reserved": np.where(lifecycle["operation"] == "destroyed", 0, lifecycle["reserved"]),
                      "operation": lifecycle["operation"]}),
    ], ignore_index=True).sort_values("ts_ns", kind="stable")
    types = dict(zip(zip(lifecycle["pid"], lifecycle["device"], lifecycle["address"]), lifecycle["pool_type"]))
    pools, changes = [], []
    for (pid, device, address), rows in points.groupby(["pid", "device", "address"], sort=True):
        used = np.cumsum(rows["used_delta"].to_numpy())
        reserved = np.maximum(rows["reserved"].to_numpy(), 0)
        ts = rows["ts_ns"].to_numpy()
        operation = rows["operation"].to_numpy()
        created = ts[operation == "created"]
        destroyed = ts[operation == "destroyed"]
        pools.append(PoolUse(
            pid=int(pid), device=int(device), gpu=gpu_of(int(pid), int(device)), address=int(address),
            pool_type=str(types.get((pid, device, address), "")),
            created_ns=int(created[0]) if len(created) else None,
            peak_reserved_bytes=int(reserved.max()), peak_used_bytes=int(max(used.max(), 0)),
            end_reserved_bytes=int(reserved[-1]), trims=int((operation == "trimmed").sum()),
            destroyed_ns=int(destroyed[-1]) if len(destroyed) else None,
            **_downsampled(ts, reserved, np.maximum(used, 0))))
        # A pool that never handed anything out is not counted (whether the driver backed its
        # size is not visible), nor one whose size was not recorded (NULL: reserve 0). A pool
        # holds at least what it handed out: the unused reserve is never below 0.
        if used.max() > 0 and reserved.max() > 0:
            unused = np.maximum(reserved - np.maximum(used, 0), 0)
            changes.append(pd.DataFrame({"ts_ns": ts, "pid": pid, "device": device,
                                         "delta_bytes": np.diff(unused, prepend=0)}))
    return pools, pd.concat(changes, ignore_index=True) if changes else _no_changes()


def reserve_adjustment(events: pd.DataFrame, changes: pd.DataFrame) -> Optional[ReserveChanges]:
    """The changes of each process's and device's pools' unused reserve to add to `delta_bytes`
    for GPU-resident live bytes, as (event rows, bytes), the rows sorted and distinct; None
    without pools. Each change goes to the first GPU-resident event of that process and device
    at or after it (a trim between two events is counted at the next one: peaks, taken at
    events, stay exact). A few rows, not a column of 1e7 zeros (reserve_at reads them)."""
    if changes.empty or events.empty:
        return None
    resident = events["kind"].isin(GPU_RESIDENT_KINDS).to_numpy()
    pids, devices, ts = events["pid"].to_numpy(), events["device"].to_numpy(), events["ts_ns"].to_numpy()
    at_rows, amounts, times = [], [], []
    for (pid, device), group in changes.groupby(["pid", "device"], sort=False):
        rows = np.flatnonzero(resident & (pids == pid) & (devices == device))
        if len(rows) == 0:
            continue
        at = np.searchsorted(ts[rows], group["ts_ns"].to_numpy(), side="left")
        inside = at < len(rows)
        at_rows.append(rows[at[inside]])
        amounts.append(group["delta_bytes"].to_numpy()[inside].astype("int64"))
        times.append(group["ts_ns"].to_numpy()[inside].astype("int64"))
    if not at_rows:
        return np.zeros(0, "int64"), np.zeros(0, "int64"), np.zeros(0, "int64")
    targets, amount, when = np.concatenate(at_rows), np.concatenate(amounts), np.concatenate(times)
    rows, slot = np.unique(targets, return_inverse=True)
    summed = np.zeros(len(rows), "int64")
    np.add.at(summed, slot, amount)  # several changes before one event add up
    own = events["delta_bytes"].to_numpy()[rows]
    return rows, summed, reached_before(slot, when, amount, summed + own, ts[rows])


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


def reserve_at(rows: np.ndarray, changes: ReserveChanges) -> np.ndarray:
    """The pools' unused reserve after each of `rows` (sorted event rows of one process and
    device, or of one GPU): the running sum of the reserve_adjustment changes at those rows."""
    change_rows, change_bytes = changes[0], changes[1]
    per_row = np.zeros(len(rows), "int64")
    at = np.searchsorted(rows, change_rows)
    hit = at < len(rows)
    hit[hit] = rows[at[hit]] == change_rows[hit]
    per_row[at[hit]] = change_bytes[hit]
    return np.cumsum(per_row)


def _downsampled(ts: np.ndarray, reserved: np.ndarray, used: np.ndarray) -> dict:
    keep = np.arange(len(ts))
    if len(ts) > MAX_POINTS:
        # the highest reserve and the last point of each bucket survive
        buckets = np.minimum((np.arange(len(ts)) * MAX_POINTS // 2) // len(ts), MAX_POINTS // 2 - 1)
        frame = pd.DataFrame({"bucket": buckets, "reserved": reserved, "row": np.arange(len(ts))})
        highest = frame.loc[frame.groupby("bucket")["reserved"].idxmax(), "row"].to_numpy()
        last = frame.groupby("bucket")["row"].max().to_numpy()
        keep = np.unique(np.concatenate([highest, last]))
    return {"ts_ns": ts[keep].astype("int64").tolist(), "reserved_bytes": reserved[keep].astype("int64").tolist(),
            "used_bytes": used[keep].astype("int64").tolist()}


def _no_changes() -> pd.DataFrame:
    return pd.DataFrame({"ts_ns": pd.Series(dtype="int64"), "pid": pd.Series(dtype="int32"),
                         "device": pd.Series(dtype="int16"), "delta_bytes": pd.Series(dtype="int64")})
