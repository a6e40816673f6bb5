"""A batch of memory events, as the engine's reducers take them (nsysan/engine): the whole events
frame as one (engine.frame_batch), or each of a flow's time-ordered batches (stream.EventFlow);
and the live allocations carried from one batch to the next."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

# A live allocation, carried from batch to batch until its free.
LIVE_COLUMNS = ("seq", "ts", "pid", "device", "kind", "address", "bytes", "pool")


@dataclass
class EventBatch:
    """Consecutive events in canonical order, as the events frame would hold them: `seq` is the
    row in that frame; `partner_seq` the row of a free's allocation (-1 for an allocation or an
    unmatched free); `kind` a code into `EventFlow.kinds` (stream.py)."""

    seq: np.ndarray
    ts: np.ndarray
    pid: np.ndarray
    device: np.ndarray
    kind: np.ndarray
    is_alloc: np.ndarray
    address: np.ndarray
    bytes: np.ndarray
    delta: np.ndarray
    pool: np.ndarray
    partner_seq: np.ndarray
    correlation: np.ndarray  # the API call's correlation id (0 for none: module statics)
    # allocations that can never be freed any more (another allocation took their address while
    # they were live), and the live allocations before this batch: LIVE_COLUMNS columns
    closed: dict = field(default_factory=dict)
    live_before: dict = field(default_factory=dict)
    # the API call joined to each event (stream_calls.CallWindow.join), in the full analysis
    calls: dict = field(default_factory=dict)
    # the pool rows of the batch's timestamps: read_pools.POOL_USAGE_COLUMNS, in their order
    pools: dict = field(default_factory=dict)
    # what the analyses (nsysan/engine reducers) make of this batch once for all of them, by name
    shared: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.seq)


def batch_rows(batch: EventBatch, rows: np.ndarray) -> pd.DataFrame:
    """Rows of `batch` as the live sets list them (LIVE_COLUMNS but the pool flag)."""
    return pd.DataFrame({"seq": batch.seq[rows], "ts": batch.ts[rows], "pid": batch.pid[rows],
                         "device": batch.device[rows], "kind": batch.kind[rows], "address": batch.address[rows],
                         "bytes": batch.bytes[rows]})


def no_rows() -> pd.DataFrame:
    """batch_rows of no row: the columns, empty."""
    return pd.DataFrame({c: np.zeros(0, "uint64" if c == "address" else "int64")
                         for c in ("seq", "ts", "pid", "device", "kind", "address", "bytes")})


def live_after(live: dict, batch: EventBatch) -> dict:
    """The live allocations after `batch`, from those before it: its allocations joined, those it
    freed or closed gone (what stream.EventFlow carries)."""
    allocs = np.flatnonzero(batch.is_alloc)
    columns = {"seq": batch.seq, "ts": batch.ts, "pid": batch.pid, "device": batch.device, "kind": batch.kind,
               "address": batch.address, "bytes": batch.bytes, "pool": batch.pool}
    joined = {name: np.concatenate([live[name], columns[name][allocs]]) for name in LIVE_COLUMNS}
    gone = np.concatenate([batch.partner_seq[batch.partner_seq >= 0], batch.closed.get("seq", np.zeros(0, "int64"))])
    # the freed and closed found by their places (an isin sorted both: 10 ms per batch of 2^18 at
    # 1e7 events); those not at their place (none, if the live seqs are in order) by an isin
    at = np.minimum(places(joined["seq"], len(live["seq"]), batch, allocs, gone), len(joined["seq"]) - 1)
    found = joined["seq"][at] == gone if len(joined["seq"]) else np.zeros(len(gone), bool)
    still = ~np.isin(joined["seq"], gone[~found]) if not found.all() else np.ones(len(joined["seq"]), bool)
    still[at[found]] = False
    return {name: values[still] for name, values in joined.items()}


def places(seqs: np.ndarray, live: int, b: EventBatch, allocs: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """np.searchsorted(seqs, wanted), where `seqs` are the seqs of `live` allocations before batch
    `b` (all before its first, in order) and then of its allocations `allocs`: a seq of the batch's
    own is found from its offset in the batch (a batch's seqs follow each other), the rest by a
    search among the live ones (a search among them all for some 130,000 frees in no order took
    15 ms per batch at 1e7 events)."""
    n = len(b)
    if n == 0 or int(b.seq[-1]) - int(b.seq[0]) != n - 1:  # not consecutive
        return np.searchsorted(seqs, wanted)
    own = wanted >= b.seq[0]
    at = np.empty(len(wanted), "int64")
    before = np.cumsum(b.is_alloc) - b.is_alloc  # allocations of the batch before each event
    offset = np.minimum(wanted[own] - int(b.seq[0]), n - 1)
    at[own] = live + np.where(offset == wanted[own] - int(b.seq[0]), before[offset], len(allocs))
    at[~own] = np.searchsorted(seqs[:live], wanted[~own])
    return at
