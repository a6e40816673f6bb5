"""The memory events as a flow of time-ordered batches (batch.EventBatch), in bounded memory, for
an export too large to hold whole.

Rows are read a rowid range at a time (read.memory_event_chunks) and decoded by normalize's
decoder (`decode_rows`, which decodes the whole table for the events frame). Exports are written nearly in time order, but not exactly (nsys 2025.6 writes rows
out of it): a batch holds back the rows whose sort key a later chunk could still undercut, and
emits the rest in canonical order (time, frees before allocations, export order). While the rows
are in order chunk by chunk, only the last timestamp of a chunk waits for the next; when a chunk
starts before what was emitted, the flow starts again knowing each chunk's earliest time (one
aggregate query), so rows wait only as long as an earlier row can still come: a bounded merge
for nearly ordered exports, everything held for a shuffled one.

Allocations are paired with frees by (process, address) across batches, by the frame's rule
(normalize.pair_allocs_and_frees) over the batch and the allocations still live before it, which
are carried from batch to batch and are all that grows with the capture.

The memory-pool rows (read_pools.pool_usage: every row with a pool, those left out of the events
for a bad value too, as long as they have a time) flow in the same order, each batch carrying the
pool rows of its timestamps (`EventBatch.pools`, in pool_usage's order).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, TypeVar

import numpy as np
import pandas as pd

from ..model import KINDS, Diagnostic
from ..sources.reader import release_memory
from ..sources.schema import Schema
from .normalize import BAD_ROW_REASONS, _sizes_and_deltas, allocated_bytes, bad_rows_note, check_sums_fit, \
    copies, copies_note, decode_rows, overlapping_note, pair_allocs_and_frees, tied_to_a_neighbour
from .read import memory_chunk_first_starts, memory_event_chunks, memory_sorted_runs
from .read_order import memory_chunks_look_unordered
from .read_pools import usable_times
from .batch import LIVE_COLUMNS, EventBatch, live_after
from .spill import Kept
from .threads import each_done as _each, made_ahead as _made_ahead

_INT64_MAX = np.iinfo("int64").max
# Rowids read at a time: a chunk's decoded rows and their temporaries stay some 30 MB, for each
# time-ordered run being merged.
CHUNK_ROWIDS = 1 << 18
# Runs merged at most; beyond, rows wait for each chunk's earliest time (a table in no order).
MOST_RUNS = 64
T = TypeVar("T")

# The decoded columns of a row (decode_rows' and its sort key and flags), carried while it waits
# for its place in time.
_ROW = {"key": "int64", "position": "int64", "ts": "int64", "global_pid": "int64", "op": "int8",
        "address": "int64", "bytes": "int64", "device": "int16", "kind_id": "int64", "kind_null": "bool",
        "correlation": "int64", "correlation_null": "bool", "flags": "int8", "pool_address": "int64",
        "pool_size": "int64"}
# flags (int8, the only narrow column: a pool row outside the events costs a byte less per row held)
IS_EVENT, IS_POOL_ALLOC = 1, 2


def _give_back(batch_number: int) -> None:
    """Every 4th batch (a million events or so), the heap's free memory back to the system: the
    command line's heap keeps up to 1 GB of freed memory for reuse
    (malloc_tuning.keep_large_arrays_on_the_heap), which a flow of batches would fill with their
    temporaries (a trim takes some 10 ms)."""
    if batch_number % 4 == 3:
        release_memory()


def _kept_batches() -> Kept[EventBatch]:
    """Batches kept for a second pass: up to CHUNK_ROWIDS events (a chunk's worth, what one batch
    holds anyway) in memory, `shared` and all (the second look reuses what the first made of
    them); past that on disk, by group of equal lengths: a batch's own arrays ("") and its dicts
    of arrays (an empty dict is no group, and read back empty; `live_before` is kept only when
    small, _keeps_live)."""
    def groups(batch: EventBatch) -> dict:
        own = {f.name: getattr(batch, f.name) for f in dataclasses.fields(EventBatch) if f.type == "np.ndarray"}
        return {"": own, **{name: getattr(batch, name) for name in ("closed", "calls", "pools", "live_before")
                            if getattr(batch, name)}}

    return Kept(CHUNK_ROWIDS, len, groups, lambda read: EventBatch(**read.pop(""), **read))


def _keeps_live(batch: EventBatch) -> bool:
    """Whether the live allocations before `batch` are kept with it for the second pass, rather
    than made again from those before the batch before it (batch.live_after): when they are a
    quarter of its events or fewer (at 1e7 events some 8,000 live to 285,000 events a batch, and
    made again they took 0.4 s of the second pass's reading thread); a capture whose live
    allocations keep growing would otherwise write them again with every batch."""
    return len(batch.live_before.get("seq", ())) * 4 <= len(batch)


class _OutOfOrder(Exception):
    """A chunk starts before rows already emitted: the flow starts again as a merge."""


@dataclass
class EventFlow:
    """Passes over the memory events: `feed` hands each EventBatch on, after which `live` holds
    the allocations never freed and `diagnostics` what normalize would say."""

    conn: sqlite3.Connection
    schema: Schema
    runs: Optional[list] = None  # rowid ranges in time order; None until rows are found out of order
    runs_guessed: bool = False  # runs where probes saw steps back (read_order.runs_at_steps), checked as read
    first_starts: Optional[list] = None  # per chunk, when the runs are too many
    kinds: list[str] = field(default_factory=list)
    live: dict = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    events: int = 0
    # joins each batch to its API calls (stream_calls.CallWindow); None: --quick reads no calls
    call_window: Optional[object] = None
    order_ahead: Optional[object] = None  # a Future of read_order.table_order, started before the flow
    made_ahead: bool = True  # the batches made on a thread of their own (_made_ahead)

    def __post_init__(self) -> None:
        names = self.schema.mem_kinds
        # KINDS first, then other names by their enum id: the order normalize gives the kinds
        extra = sorted({name for name in names.values() if name not in KINDS},
                       key=lambda name: min(i for i, n in names.items() if n == name))
        self.kinds = list(KINDS) + extra
        self._kind_code = {name: i for i, name in enumerate(self.kinds)}

    def feed(self, make: Callable[[], T], keep: bool = False,
             ahead: Optional[Callable[[EventBatch], None]] = None) -> T:
        """One pass of every batch into `make()`'s `add`; the filled object. When rows turn out
        to be out of time order, the pass starts again on a new object, as a merge. `keep`: the
        batches are also written to a temporary file, for `replay`. `ahead(batch)`: work on each
        batch before `add`, done where the batches are made (see replay)."""
        if self.runs is None and self.first_starts is None and not getattr(self, "_probed", False):
            self._probed = True  # once: a later pass knows the runs already
            if self.order_ahead is not None:  # found meanwhile (read_order.order_ahead)
                self.runs, self.first_starts, self.runs_guessed = self.order_ahead.result()
            elif memory_chunks_look_unordered(self.conn, CHUNK_ROWIDS):
                self._find_runs()  # a merge from the start, rather than after some batches
        while True:
            consumer = make()
            kept = _kept_batches() if keep else None
            self._kept_live: list[bool] = []  # per kept batch, whether its live_before is kept with it
            try:
                batches = self._batches() if ahead is None else _each(self._batches(), ahead)
                batches = _made_ahead(batches) if self.made_ahead else batches
                for number, batch in enumerate(batches):
                    consumer.add(batch)
                    if kept is not None:
                        self._kept_live.append(_keeps_live(batch))
                        kept.add(batch if self._kept_live[-1] else dataclasses.replace(batch, live_before={}))
                    _give_back(number)
            except _OutOfOrder:
                if kept is not None:
                    kept.close()
                if self.runs is not None and not self.runs_guessed:  # pragma: no cover - a merge of
                    raise  # runs found from every row never emits out of order
                self.runs_guessed = False  # a guessed run went back in time: the runs from every row
                self._find_runs()
                continue
            except sqlite3.ProgrammingError:
                if kept is not None:
                    kept.close()
                if not self.made_ahead:
                    raise
                self.made_ahead = False  # a connection bound to its thread (a caller's own): made on this one
                continue
            if self.call_window is not None and not self.call_window.exact:
                # an event's call lay outside the window: again, every call held (stream_calls.py)
                if kept is not None:
                    kept.close()
                self.call_window.keep_all = True
                continue
            self._kept = kept
            return consumer

    def _find_runs(self) -> None:
        """The table's time-ordered runs, for a merge; too many: each chunk's earliest time."""
        self.runs = memory_sorted_runs(self.conn, CHUNK_ROWIDS, MOST_RUNS) or []
        if not self.runs:  # rows in no order: each chunk's earliest time tells how long to wait
            self.first_starts = memory_chunk_first_starts(self.conn, CHUNK_ROWIDS)

    def replay(self, make: Callable[[], T], ahead: tuple[Callable[[EventBatch], None], ...] = ()) -> T:
        """A second pass: the batches the first one kept (`feed(keep=True)`), read back from the
        temporary file, without reading, ordering and pairing the table again; the table's rows
        again when they could not all be kept (a full disk). `ahead`: stages of work on each batch
        that read nothing of `make()`'s, each on a thread of its own a batch ahead of the next
        stage (the first, on the thread that reads the batches back), the consumer taking the batch
        the last stage let go (as the first pass's batches are made, _made_ahead): the second look's
        labels and the engine's reducers that may go ahead, each on a core while the consumer's
        reducers look at the batch before."""
        kept, self._kept = getattr(self, "_kept", None), None
        if kept is None or not kept.complete:
            if kept is not None:
                kept.close()
            return self.feed(make, ahead=(lambda batch: [work(batch) for work in ahead]) if ahead else None)
        consumer = make()

        with_live = self._kept_live

        def read_back() -> Iterator[EventBatch]:
            live = {name: np.zeros(0, "uint64" if name == "address" else "int64") for name in LIVE_COLUMNS}
            for i, batch in enumerate(kept):
                if not with_live[i]:
                    batch.live_before = live
                yield batch
                if i + 1 < len(with_live) and not with_live[i + 1]:  # the next batch's, not kept with it
                    live = live_after(batch.live_before, batch)

        try:
            batches = read_back()
            for work in ahead[:-1]:
                batches = _made_ahead(_each(batches, work))
            batches = _made_ahead(_each(batches, ahead[-1]) if ahead else batches)
            for number, batch in enumerate(batches):
                consumer.add(batch)
                _give_back(number)
        finally:
            kept.close()
        return consumer

    def _batches(self) -> Iterator[EventBatch]:
        self.live = {name: np.zeros(0, "uint64" if name == "address" else "int64") for name in LIVE_COLUMNS}
        self.events, self._copies, self._overlapping, self._allocated = 0, 0, 0, 0.0
        self._bad_reasons = np.zeros(len(BAD_ROW_REASONS), "int64")
        self._emitted_key: Optional[int] = None
        if self.call_window is not None:
            self.call_window.restart()
        if self.runs:
            yield from self._merged_runs()
        else:
            yield from self._one_scan()
        self._finish()
        if self.call_window is not None:
            self.call_window.finish()

    def _chunks(self, rowids: Optional[tuple[int, int]] = None, size: Optional[int] = None,
                run: bool = False) -> Iterator[dict]:
        """Decoded rows of each chunk of `size` rowids (of the rows between two rowids). `run`: the
        rows are a guessed run (runs_guessed), checked to go on in time order."""
        last = [] if run and self.runs_guessed else None  # the run's latest start so far
        for raw in memory_event_chunks(self.conn, self.schema, size or CHUNK_ROWIDS, rowids):
            if raw.empty:  # rowids without rows: still a chunk (see _later_starts)
                yield _no_rows()
                continue
            yield self._decode(raw, last)

    def _merged_runs(self) -> Iterator[EventBatch]:
        """A k-way merge of the table's time-ordered runs (memory_sorted_runs), a chunk of each
        waiting at a time: rows before the latest time every unfinished run has reached are final.
        A batch is emitted once some CHUNK_ROWIDS rows are final (the run that holds the others
        back reads on): the runs, reached in turns, would otherwise make lumpy batches of a few
        rows to a chunk's, and each batch costs every analysis a fixed toll."""
        # the runs' chunks together as long as one chunk
        sources = [self._chunks(run, max(CHUNK_ROWIDS // len(self.runs), 1), run=True) for run in self.runs]
        # per run, its chunks read and not emitted yet (each in time order, the first maybe cut
        # short), joined only when emitted: a copy of every row less than joining at each read
        pending: list[list[dict]] = [[] for _ in sources]
        done = [False] * len(sources)

        def read(i: int) -> None:
            rows = next(sources[i], None)
            if rows is None:
                done[i] = True
            elif len(rows["ts"]):
                pending[i].append(rows)

        while True:
            for i in range(len(sources)):
                # a run's rows at its last time read may go on in its next chunk
                while not done[i] and (not pending[i] or pending[i][0]["ts"][0] == pending[i][-1]["ts"][-1]):
                    read(i)
            while True:
                open_runs = [(int(chunks[-1]["ts"][-1]), i) for i, chunks in enumerate(pending) if not done[i]]
                until = min(open_runs)[0] if open_runs else None
                ready = [[len(c["ts"]) if until is None else int(np.searchsorted(c["ts"], until, side="left"))
                          for c in chunks] for chunks in pending]
                if until is None or sum(map(sum, ready)) >= CHUNK_ROWIDS:
                    break
                read(min(open_runs)[1])  # the run that holds the others back
            # the runs in rowid order, each in export order: a stable sort by key keeps export order at a tie
            parts = [(c, n) for chunks, counts in zip(pending, ready) for c, n in zip(chunks, counts) if n]
            out = {name: np.concatenate([c[name][:n] for c, n in parts] or [_no_rows()[name]]) for name in _ROW}
            pending = [[{name: values[n:] for name, values in c.items()} if n else c
                        for c, n in zip(chunks, counts) if n < len(c["ts"])] for chunks, counts in zip(pending, ready)]
            order = np.argsort(out["key"], kind="stable")
            batch = self._emit({name: values[order] for name, values in out.items()})
            if batch is not None:
                yield batch
            if until is None:
                return

    def _one_scan(self) -> Iterator[EventBatch]:
        waiting = _no_rows()
        offset = self.schema.time_offset_ns
        later_starts = self._later_starts()
        for index, rows in enumerate(self._chunks()):
            # back to a timestamp already emitted: every row of a timestamp goes in one batch (the
            # pools' reserve at a moment is that of its last row; copies share their timestamp)
            if self.first_starts is None and self._emitted_key is not None and len(rows["key"]) \
                    and rows["key"].min() >> 1 <= self._emitted_key >> 1:
                raise _OutOfOrder
            waiting = {name: np.concatenate([waiting[name], rows[name]]) for name in _ROW}
            order = np.argsort(waiting["key"], kind="stable")
            waiting = {name: values[order] for name, values in waiting.items()}
            if later_starts is not None:  # everything before the earliest start still to come
                later = later_starts[index] if index < len(later_starts) else None
                limit = later * 2 - 2 * offset if later is not None else _INT64_MAX
                ready = int(np.searchsorted(waiting["key"], limit, side="left"))
            else:  # in order so far: all but the last timestamp, which the next chunk may continue
                keys = waiting["key"]
                ready = int(np.searchsorted(keys, keys[-1] - keys[-1] % 2, side="left")) if len(keys) else 0
            if ready:
                out = {name: values[:ready] for name, values in waiting.items()}
                waiting = {name: values[ready:] for name, values in waiting.items()}
                batch = self._emit(out)
                if batch is not None:
                    yield batch
        if len(waiting["key"]):
            batch = self._emit(waiting)
            if batch is not None:
                yield batch

    def _later_starts(self) -> Optional[list]:
        """Per chunk: the earliest start of the chunks after it (None after the last)."""
        if self.first_starts is None:
            return None
        later, lowest = [], None
        for start in reversed(self.first_starts):
            later.append(lowest)
            if isinstance(start, (int, float)) and start == start:  # a REAL start is read as an integer
                start = int(np.floor(max(min(start, 2.0**62), -2.0**62)))
                lowest = start if lowest is None else min(lowest, start)
        return later[::-1]

    def _decode(self, raw: pd.DataFrame, last: Optional[list] = None) -> dict:
        """A chunk's rows decoded (decode_rows), the bad ones counted and left out, with their sort
        keys. `last`: the latest start of the run before them, which their starts must not go back
        from (memory_sorted_runs' rule: rows without a start break no order); raises _OutOfOrder."""
        offset = self.schema.time_offset_ns
        rows = decode_rows(raw, self.schema)
        if last is not None:
            known = rows["ts"][~rows["ts_bad"]]
            if len(known):
                if (last and known[0] < last[0]) or (known[1:] < known[:-1]).any():
                    raise _OutOfOrder
                last[:] = [int(known[-1])]
        bad = rows["reason"] >= 0
        self._bad_reasons += np.bincount(rows["reason"][bad], minlength=len(BAD_ROW_REASONS))
        self._allocated += allocated_bytes(rows["bytes"], rows["op"], bad)
        # pool rows stay for the pools even when left out of the events, if they have a time
        kept = {name: rows[name] for name in _ROW if name in rows}
        if bad.any():
            keep = np.flatnonzero(~bad | ((rows["pool_address"] != 0) & usable_times(rows["ts"], rows["ts_bad"], offset)))
            kept, bad = {name: values[keep] for name, values in kept.items()}, bad[keep]
        alloc = kept["op"] == 0
        kept["key"] = (kept["ts"] - offset) * 2 + alloc
        # IS_EVENT (1) for a good row, IS_POOL_ALLOC (2) for an allocation, from the masks' bytes
        kept["flags"] = (~bad).view("int8") | (alloc.view("int8") << 1)
        return kept

    def _emit(self, rows: dict) -> Optional[EventBatch]:
        """Rows in canonical order (every row of each of their timestamps) as the next batch."""
        if not len(rows["key"]):
            return None
        self._emitted_key = int(rows["key"][-1])
        pools = _pool_rows(rows, self.schema.time_offset_ns)
        events = (rows["flags"] & IS_EVENT) != 0
        if not events.all():
            rows = {name: values[events] for name, values in rows.items()}
        rows = self._without_copies(rows)
        if not len(rows["key"]):  # pool rows alone (left out of the events), or nothing
            if not len(pools["ts_ns"]):
                return None
            none = np.zeros(0, "int64")
            return self._joined(EventBatch(
                seq=none, ts=none, pid=none, device=none, kind=none, is_alloc=none.astype(bool),
                address=none.astype("uint64"), bytes=none, delta=none, pool=none.astype(bool), partner_seq=none,
                correlation=none, live_before=self.live), pools)
        n = len(rows["key"])
        seq = np.arange(self.events, self.events + n, dtype="int64")
        self.events += n
        pid = ((rows["global_pid"] >> 24) & 0xFFFFFF).astype("int64")
        names = self.schema.mem_kinds
        slot, distinct = pd.factorize(rows["kind_id"])
        kind = np.array([self._kind_code[names.get(int(k), "unknown")] for k in distinct], "int64")[slot]
        is_alloc = rows["op"] == 0
        address = rows["address"].view("uint64")
        batch = self._paired(seq, rows["ts"] - self.schema.time_offset_ns, pid, rows["device"].astype("int64"),
                             kind, is_alloc,
                             address, rows["bytes"], rows["pool_address"] != 0, rows["correlation"])
        return self._joined(batch, pools)

    def _joined(self, batch: EventBatch, pools: dict) -> EventBatch:
        """The batch with its pool rows and, in the full analysis, its events' API calls."""
        batch.pools = pools
        if self.call_window is not None:
            batch.calls = self.call_window.join(batch)
        return batch

    def _without_copies(self, rows: dict) -> dict:
        """The rows without those that repeat an earlier row exactly (normalize.copies)."""
        repeated = copies(rows["key"], rows)
        if not len(repeated):
            return rows
        self._copies += len(repeated)
        kept = np.ones(len(rows["key"]), bool)
        kept[repeated] = False
        return {name: values[kept] for name, values in rows.items()}

    def _paired(self, seq, ts, pid, device, kind, is_alloc, address, size, pool, correlation) -> EventBatch:
        """The batch's frees paired with the allocation before them at their (process, address),
        the live allocations of earlier batches included (normalize.pair_allocs_and_frees)."""
        live = self.live
        carried = len(live["seq"])
        columns = {"seq": seq, "ts": ts, "pid": pid, "device": device, "kind": kind, "address": address,
                   "bytes": size, "pool": pool}
        # the live allocations, then the batch: joined for the columns the pairing reads of every
        # row, the others only gathered for the few rows that stay live or are closed
        joined = {name: np.concatenate([live[name], columns[name]]) for name in ("seq", "pid", "address", "bytes")}
        all_alloc = np.concatenate([np.ones(carried, bool), is_alloc])
        partner, superseded = pair_allocs_and_frees(joined["pid"], joined["address"], all_alloc)
        self._overlapping += len(superseded)  # allocations whose address was taken again
        sizes, delta = _sizes_and_deltas(joined["bytes"], all_alloc, partner, carried)
        own = partner[carried:]
        partner_seq = np.where(~is_alloc & (own >= 0), joined["seq"][np.maximum(own, 0)], -1)
        # the live allocations now: those neither freed nor superseded
        ended = partner >= 0
        ended[superseded] = True
        still = np.flatnonzero(all_alloc & ~ended)
        self.live = {name: _rows_of(live, columns, name, still) for name in LIVE_COLUMNS}
        closed = {name: _rows_of(live, columns, name, superseded) for name in LIVE_COLUMNS}
        return EventBatch(seq=seq, ts=ts, pid=pid, device=device, kind=kind, is_alloc=is_alloc, address=address,
                          bytes=sizes, delta=delta, pool=pool, partner_seq=partner_seq, correlation=correlation,
                          closed=closed, live_before=live)

    def _finish(self) -> None:
        check_sums_fit(self._allocated)
        notes = []
        if self._bad_reasons.any():
            notes.append(bad_rows_note(self._bad_reasons))
        if self._copies:
            notes.append(copies_note(self._copies))
        if self._overlapping:
            notes.append(overlapping_note(self._overlapping))
        self.diagnostics = notes


def _rows_of(live: dict, batch: dict, name: str, rows: np.ndarray) -> np.ndarray:
    """Column `name` at `rows` (in their order) of the `live` allocations and then the `batch`'s
    rows, as np.concatenate would join the two (its dtype too), without joining them."""
    before, after = live[name], batch[name]
    carried = len(before)
    out = np.empty(len(rows), np.concatenate([before[:0], after[:0]]).dtype)
    earlier = rows < carried
    out[earlier] = before[rows[earlier]]
    out[~earlier] = after[rows[~earlier] - carried]
    return out


def _no_rows() -> dict:
    return {name: np.zeros(0, dtype) for name, dtype in _ROW.items()}


def _pool_rows(rows: dict, time_offset_ns: int) -> dict:
    """The pool rows among a batch's rows (all of their timestamps) as read_pools.pool_usage
    makes them of the whole table: POOL_USAGE_COLUMNS (in that order), in time then export order,
    without the rows that repeat another exactly."""
    at = np.flatnonzero(rows["pool_address"] != 0)
    at = at[np.lexsort((rows["position"][at], rows["ts"][at]))]
    found = {
        "ts_ns": rows["ts"][at] - time_offset_ns,
        "pid": ((rows["global_pid"][at] >> 24) & 0xFFFFFF).astype("int32"),
        "device": rows["device"][at].astype("int16"), "address": rows["pool_address"][at],
        "is_alloc": (rows["flags"][at] & IS_POOL_ALLOC) != 0, "bytes": np.clip(rows["bytes"][at], 0, 2**50),
        "reserved": np.clip(rows["pool_size"][at], 0, 2**50),
    }
    tied = tied_to_a_neighbour(found["ts_ns"])
    if tied is not None:  # copies share their time: compared among the rows that share theirs alone
        among = np.flatnonzero(tied)
        copies = among[pd.DataFrame({**{name: values[among] for name, values in found.items()},
                                     "block": rows["address"][at[among]], "call": rows["correlation"][at[among]]})
                       .duplicated().to_numpy()]
        if len(copies):
            kept = np.ones(len(at), bool)
            kept[copies] = False
            found = {name: values[kept] for name, values in found.items()}
    return found
