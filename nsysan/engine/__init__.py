"""One engine for every analysis: each analysis is a `Reducer`, fed time-ordered event batches.

An analysis answers one question (a field of `Analysis`) as a streaming aggregator, the way
memray's aggregators each answer one question over a stream of records: it is started with the
capture's facts, added every batch of events in time order (`EventBatch`, events/batch.py),
and finished with the allocations still live at the end. Nothing else tells it how the events
were read: the whole events frame is simply one batch (`frame_batch`, numpy views of the
frame's columns), and an export too large to hold is a flow of many (`EventFlow`). So the same
code answers on both paths, and what it answers does not depend on where the batches were cut
(tests/test_engine.py checks one batch, k batches and batches of 3 rows alike).

What a batch holds is in time order with frees before allocations at one time, each event
numbered (`seq`) as the whole frame would number it; a free knows its allocation's seq
(`partner_seq`), and an allocation that can never be freed any more (its address was taken by
another while it was live) comes in the batch's `closed`. Work that several reducers need of a
batch (its (process, device, kind) groups and their running sums) is made once per batch and
kept in `EventBatch.shared`; the whole frame's is handed in already made.

A new analysis: a Reducer subclass in analyses/ (see docs/analyses.md, "How to add an analysis").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from ..events.arrays import category_codes
from ..events.load import QUICK_API
from ..events.read_pools import POOL_USAGE_COLUMNS
from ..events.batch import LIVE_COLUMNS, EventBatch, live_after

# the labelled columns of a batch's calls (Labels), as the events frame's categories hold them
LABELLED = ("api", "site", "nvtx_range", "nvtx_path", "operator")

GpuOf = Callable[[int, int], Optional[int]]  # the GPU of a process's device (None: unknown)
TotalMemory = Callable[[Optional[int]], Optional[int]]  # a GPU's memory (None: unknown)

__all__ = ["GpuOf", "TotalMemory", "Facts", "Labels", "Reducer", "Engine", "FramePieces", "frame_batch", "frame_labels",
           "frame_live", "pieces"]


@dataclass
class Facts:
    """What a reducer may know before the first event: the names of the kind codes of the
    batches (`kinds[batch.kind]`), and the GPU of a process's device (None when unknown)."""

    kinds: Sequence[str]
    gpu_of: GpuOf = lambda pid, device: None
    more: dict = field(default_factory=dict)


@dataclass
class Labels:
    """What the labelled columns of a batch's `calls` name: the codes of "api" (every event's API,
    or what stands for none), "site" and "nvtx_range" (every event's innermost user range) index
    `apis`, `sites` and `ranges` (-1: none), those of "nvtx_path" (that range's path) and
    "operator" (its innermost operator range) `paths` and `operators`;
    equal sites rank by `site_order` (code -> rank; by code when empty); `path(seq, pid, tid, ts)`
    is an event's NVTX path. The whole frame's are its categories (frame_labels); the streamed full
    analysis labels each batch on its second look (events.flow_labels.FlowLabels); --quick streamed
    reads no call: these defaults."""

    apis: Sequence[str] = (QUICK_API,)
    sites: Sequence[str] = ("",)
    ranges: Sequence[str] = ("",)
    site_order: Sequence[int] = ()
    path: Callable[[int, int, int, int], str] = lambda seq, pid, tid, ts: ""
    paths: Sequence[str] = ("",)
    operators: Sequence[str] = ("",)

    def site_rank(self, code: int) -> int:
        return self.site_order[code] if code >= 0 and len(self.site_order) else code


class Reducer:
    """One analysis over a flow of event batches.

    `field`: the field of `Analysis` it fills. `needs`: what it needs beyond the events (names of
    Facts' entries or other reducers' fields), for the engine to order and feed it;
    `second_look`: it reads every batch twice, the second time knowing what the first summed.
    `ahead`: its second look reads the batch (labelled, engine.Labels) and the facts alone, so a
    flow may run it on the thread that reads the batches back, a batch ahead of the others
    (Engine.again), as long as no other reducer needs its field.
    start -> add(batch) for each batch in time order -> [between() -> again(batch) for each
    batch] -> finish(live) = the field's value."""

    field: str = ""
    needs: tuple[str, ...] = ()
    second_look: bool = False
    ahead: bool = False

    def start(self, facts: Facts) -> None:
        self.facts = facts

    def add(self, batch: EventBatch) -> None:
        raise NotImplementedError

    def between(self) -> None:
        """After the first look, before the second (second_look reducers)."""

    def again(self, batch: EventBatch) -> None:
        """The second look at a batch (second_look reducers)."""

    def finish(self, live: dict) -> Any:
        """The answer, given the allocations live after the last batch (LIVE_COLUMNS)."""
        raise NotImplementedError


class Engine:
    """Feeds each batch to every reducer, in the order of what they need, and gathers their
    answers by field."""

    def __init__(self, reducers: Iterable[Reducer], facts: Facts) -> None:
        self.reducers = _ordered(list(reducers))
        for reducer in self.reducers:
            reducer.start(facts)
        needed = {name for reducer in self.reducers for name in reducer.needs}
        # the second looks that may go a batch ahead of the others (Reducer.ahead)
        self.ahead = [r.second_look and r.ahead and r.field not in needed for r in self.reducers]

    def add(self, batch: EventBatch) -> None:
        for reducer in self.reducers:
            reducer.add(batch)

    @property
    def second_look(self) -> bool:
        return any(reducer.second_look for reducer in self.reducers)

    def between(self) -> None:
        for reducer in self.reducers:
            if reducer.second_look:
                reducer.between()

    def again(self, batch: EventBatch, ahead: Optional[bool] = None) -> None:
        """The second look at `batch`: of every reducer that looks twice, or (`ahead` true) of
        those that may go ahead (Reducer.ahead) or (false) of the others."""
        for reducer, may in zip(self.reducers, self.ahead):
            if reducer.second_look and (ahead is None or may == ahead):
                reducer.again(batch)

    def finish(self, live: dict) -> dict[str, Any]:
        return {reducer.field: reducer.finish(live) for reducer in self.reducers}

    def reducer(self, field: str) -> Reducer:
        return next(r for r in self.reducers if r.field == field)

    def so_far(self, field: str) -> Any:
        """The answer of the reducer of `field` from the batches so far, before the flow ends
        (one whose answer reads no live set: a top-K, a count)."""
        return self.reducer(field).finish({})

    def run(self, batches: Sequence[EventBatch], live: dict) -> dict[str, Any]:
        """Every look at `batches`, held in memory (the whole frame: one batch, looked at twice
        without a copy; a flow too large to hold is fed by its reader instead: add, between,
        again, finish)."""
        for batch in batches:
            self.add(batch)
        if self.second_look:
            self.between()
            for batch in batches:
                self.again(batch)
        return self.finish(live)


def _ordered(reducers: list[Reducer]) -> list[Reducer]:
    """The reducers, each after those whose fields it needs (their order kept otherwise)."""
    done: list[Reducer] = []
    fields = {r.field for r in reducers}
    while reducers:
        ready = [r for r in reducers if not (set(r.needs) & fields - {d.field for d in done})]
        if not ready:
            raise ValueError(f"reducers need each other: {[r.field for r in reducers]}")
        done += ready
        reducers = [r for r in reducers if r not in ready]
    return done


def frame_batch(events: pd.DataFrame, shared: Optional[dict] = None,
                pools: Optional[pd.DataFrame] = None) -> EventBatch:
    """The whole events frame (events/columns.py EVENT_COLUMNS) as one batch, its columns numpy
    views where their types agree (kind: the frame's category codes, named by
    `events["kind"].cat.categories`; of the API calls' columns, the thread `tid` and the labelled
    columns, named by frame_labels); `shared`: per-batch work already made (see EventBatch); `pools`:
    the pool rows (LoadedEvents.pool_usage)."""
    columns, partner = _frame_columns(events)
    return EventBatch(seq=np.arange(len(events), dtype="int64"),
                      partner_seq=np.where(columns["is_alloc"], -1, partner), **columns, shared=dict(shared or {}),
                      pools={name: pools[name].to_numpy() for name in POOL_USAGE_COLUMNS} if pools is not None else {})


def _frame_columns(events: pd.DataFrame) -> tuple[dict, np.ndarray]:
    """frame_batch's columns but the two it makes (seq, partner_seq), views of the frame's, as
    EventBatch's arguments; and the frame's partners (each free's allocation row, else -1)."""
    n = len(events)
    is_alloc = events["op"].cat.codes.to_numpy() == 0 if n else np.zeros(0, bool)
    partner = events["partner"].to_numpy() if n else np.zeros(0, "int64")
    column = (lambda name, dtype: events[name].to_numpy()) if n else \
        (lambda name, dtype: np.zeros(0, dtype))
    codes = (lambda name: category_codes(events[name])) if n else (lambda name: np.zeros(0, "int8"))
    return dict(
        ts=column("ts_ns", "int64"), pid=column("pid", "int64"), device=column("device", "int64"),
        kind=events["kind"].cat.codes.to_numpy() if n else np.zeros(0, "int8"),
        is_alloc=is_alloc, address=column("address", "uint64"), bytes=column("bytes", "int64"),
        delta=column("delta_bytes", "int64"), pool=column("pool", bool) if "pool" in events or not n
        else np.zeros(n, bool),
        # only the flow's labels read the calls' ids: here a view of one 0 (np.zeros: 80 MB at 1e7 events)
        correlation=np.broadcast_to(np.int64(0), (n,)),
        calls={"tid": column("tid", "int32"), **{name: codes(name) for name in LABELLED}}), partner


class FramePieces:
    """The whole events frame as the engine's batches of `rows` events (the last fewer), as
    `pieces(frame_batch(events), ...)` cuts it, each batch made as it is read and gone after: what
    a reducer makes of a batch, n long, is a piece's length, and so are the two columns made for
    the engine (seq, partner_seq: 80 MB each at 1e7 events whole). Read once per look of each
    engine run, each read's batches with per-batch work of their own (`shared`: the runs on two
    cores never add to one dict at once). The allocations live before each piece are found once."""

    def __init__(self, events: pd.DataFrame, rows: int) -> None:
        self.columns, self.partner = _frame_columns(events)
        n = len(events)
        self.edges = [0, *range(rows, n, rows), n]
        # An allocation is live before a piece's first row when it comes before that row and its
        # free (the frame's pairing: partner) does not; in row order, as live_after carries them
        # (that, batch by batch, took 0.3 s of CPU at 1e7 events).
        allocs = np.flatnonzero(self.columns["is_alloc"])
        freed_at = self.partner[allocs]  # -1: never freed
        self.live_before: list[dict] = []
        for a in self.edges[:-1]:
            k = int(np.searchsorted(allocs, a))
            rows = allocs[:k][(freed_at[:k] < 0) | (freed_at[:k] >= a)]
            self.live_before.append({name: (rows if name == "seq" else self.columns[name][rows]).astype(
                "uint64" if name == "address" else "int64") for name in LIVE_COLUMNS})

    def __len__(self) -> int:
        return len(self.edges) - 1

    def __getitem__(self, i: int) -> EventBatch:
        if not 0 <= i < len(self):
            raise IndexError(i)
        a, z = self.edges[i], self.edges[i + 1]
        is_alloc = self.columns["is_alloc"][a:z]
        return EventBatch(seq=np.arange(a, z, dtype="int64"), partner_seq=np.where(is_alloc, -1, self.partner[a:z]),
                          **{name: values[a:z] for name, values in self.columns.items() if name != "calls"},
                          calls={name: values[a:z] for name, values in self.columns["calls"].items()},
                          live_before=self.live_before[i] if i < len(self.live_before) else {})


def frame_labels(events: pd.DataFrame) -> Labels:
    """What frame_batch's labelled columns name: the frame's categories, and its NVTX paths."""
    apis, sites, ranges, paths, operators = (tuple(str(c) for c in events[name].cat.categories) for name in LABELLED)
    return Labels(apis, sites, ranges, path=lambda seq, pid, tid, ts: str(events["nvtx_path"].iat[seq]), paths=paths,
                  operators=operators)


def frame_live(events: pd.DataFrame) -> dict:
    """The allocations of the whole frame never freed (no partner), as EventFlow.live lists the
    allocations live at the end (LIVE_COLUMNS): the frame's pairing already knows which address
    reuse closed an allocation, so nothing comes as `closed`."""
    if events.empty:
        return {name: np.zeros(0, "uint64" if name == "address" else "int64") for name in LIVE_COLUMNS}
    rows = np.flatnonzero((events["op"].cat.codes.to_numpy() == 0) & (events["partner"].to_numpy() < 0))
    columns = {"seq": rows, "ts": events["ts_ns"], "pid": events["pid"], "device": events["device"],
               "kind": events["kind"].cat.codes, "address": events["address"], "bytes": events["bytes"],
               "pool": events["pool"] if "pool" in events else pd.Series(np.zeros(len(events), bool))}
    return {name: rows if name == "seq" else columns[name].to_numpy()[rows] for name in LIVE_COLUMNS}


def pieces(batch: EventBatch, bounds: Iterable[int]) -> list[EventBatch]:
    """`batch` cut before each of `bounds` (row positions, ascending): views of its rows, each
    with its own `shared` (a piece is grouped on its own), the `closed` allocations of the
    whole in the first and, as a flow carries them, the allocations live before it
    (`live_before`); the pool rows up to each piece's last time in it (those after the last
    event in the last). What a reducer answers must not depend on where a flow was cut."""
    edges = [0] + [b for b in bounds if 0 < b < len(batch)] + [len(batch)]
    columns = ("seq", "ts", "pid", "device", "kind", "is_alloc", "address", "bytes", "delta", "pool",
               "partner_seq", "correlation")
    ends = np.searchsorted(batch.pools["ts_ns"], [batch.ts[z - 1] for z in edges[1:-1]], side="right") \
        if batch.pools else []
    pool_edges = [0, *ends, len(batch.pools.get("ts_ns", ()))]
    cut = [EventBatch(**{c: getattr(batch, c)[a:z] for c in columns}, closed=batch.closed if not i else {},
                      calls={k: v[a:z] for k, v in batch.calls.items()},
                      pools={k: v[pool_edges[i]:pool_edges[i + 1]] for k, v in batch.pools.items()})
           for i, (a, z) in enumerate(zip(edges[:-1], edges[1:])) if z > a or not i]
    live = {name: np.zeros(0, "uint64" if name == "address" else "int64") for name in LIVE_COLUMNS}
    for piece in cut:
        piece.live_before, live = live, live_after(live, piece)
    return cut
