"""The memory API calls in bounded memory, for the streamed full analysis: read a chunk of rowids
at a time, summed in one scan (`MemoryCalls.scan`), and joined to each batch of memory events
through a window of calls (`CallWindow`). The table is read once: the scan keeps the chunks it
decoded (in memory for a table of a chunk or so, else in a file read back memory-mapped), and
the window reads them from there.

An event lies within the span of its call's rows (start to end; checked on the captures in
fixtures/ and made so by benchmarks/make_big_export.py): the events flow in time order, so the
window needs the calls that start before the batch's last event and end after its first. The
scan notes each chunk's earliest start; a batch reads every chunk that starts before its last
event (in rowid order, so the first call of a (process, correlation id) still wins, as in
normalize.join_on_call), and calls that ended before it are dropped. For calls written in time
order (or a few runs of it, rank by rank) the window is a chunk or so per run; for calls in no
order every chunk starts early, and the window holds every call. Whether an event found no call
only because its call fell outside that span is checked at the end (`CallWindow.exact`: one more
pass over the kept calls, for the keys of the events left without a call); if so the flow runs again holding every call.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterator, Optional

import numpy as np
import pandas as pd

from ..base import apis
from ..sources.schema import Schema
from .arrays import distinct_pairs
from .normalize import join_on_call
from .read import (OTHER_ROW_COLUMNS, _call_columns, latest_ends, memory_call_chunks, memory_call_names,
                   memory_call_ranges, split_other_rows)
from .spill import Kept

# Rowids of the API table read at a time (the memory calls among them, decoded: some 10 MB).
CALL_CHUNK_ROWIDS = 1 << 18
_FAR = np.iinfo("int64").max // 4  # an end beyond this is no end (unterminated)
_REAL = ("pid", "tid", "correlation", "api", "ts", "end", "position", "ok_alloc", "matched")
_CHAIN = ("pid", "correlation", "chain", "end")
_HELD = ("pid", "tid", "correlation", "api", "end", "position", "ok_alloc", "matched")  # a call in the window
_WHOLE = (0, -1)  # the rowids of a table read as one chunk


@dataclass
class MemoryCalls:
    """The export's memory API calls, read in chunks: what one scan sums (the threads, spans)
    and each chunk's earliest start, for CallWindow."""

    conn: sqlite3.Connection
    schema: Schema
    api_names: list[str] = field(default_factory=list)  # api code -> name (first memory API id first)
    families: list[str] = field(default_factory=list)
    chunks: list[tuple[int, int]] = field(default_factory=list)  # rowids of each chunk
    first_starts: list[int] = field(default_factory=list)  # per chunk; _FAR without rows
    threads: np.ndarray = field(default_factory=lambda: np.zeros(0, "int64"))  # pid << 24 | tid, first seen first
    first_ts: Optional[int] = None  # earliest start and latest finite end of a call
    last_end: Optional[int] = None
    last_end_by_pid: dict = field(default_factory=dict)
    other_rows: Optional[pd.DataFrame] = None  # scan's `other_ids` rows

    def __post_init__(self) -> None:
        name_ids = memory_call_names(self.conn, self.schema)
        self._ids = np.array(sorted(name_ids), "int64")
        self.api_names = list(dict.fromkeys(name_ids[i] for i in self._ids.tolist()))
        self._code_of_id = np.array([self.api_names.index(name_ids[i]) for i in self._ids.tolist()], "int16")
        # the same codes by id (StringIds rows, a few thousand at most): one gather per chunk, not a search
        self._code_at = None
        if len(self._ids) and self._ids[0] >= 0 and self._ids[-1] < 1 << 20:
            self._code_at = np.zeros(int(self._ids[-1]) + 1, "int16")
            self._code_at[self._ids] = self._code_of_id
        family_of = [apis.FAMILIES.get(a, "other") for a in self.api_names]
        self.families = list(dict.fromkeys(family_of))
        self.family_code = np.array([self.families.index(f) for f in family_of], "int64")
        self._stacks = self.schema.has_backtraces
        self._kept: Optional[Kept] = None  # the chunks the scan read, for every read after it

    def __bool__(self) -> bool:
        return len(self._ids) > 0

    def scan(self, each_chunk: Optional[Callable[[dict, np.ndarray], None]] = None,
             other_ids: Collection[int] = ()) -> None:
        """One pass over the calls: the sums, and the chunks CallWindow reads. `each_chunk(calls,
        family codes)` sees every chunk of real calls, for an analysis that sums them as they are
        read (the API call stats: analyses/calls.py's CallStatSums). `other_ids`: names whose raw
        rows (read.OTHER_ROW_COLUMNS, rowid order) the same scan keeps as `other_rows` (read_code's
        code-load and graph calls: one scan of the API table, not a second one after the analysis,
        0.9 s of CPU at 1e7 events, as read.read_calls_and_rows does for the whole frame)."""
        self.close()  # a scan reads the table anew
        self.chunks, self.first_starts = [], []
        # up to a chunk's worth of calls in memory, past that in a file: the table is read once
        kept = Kept(CALL_CHUNK_ROWIDS, lambda chunk: len(chunk[0]["ts"]), lambda chunk: dict(zip(("real", "chains"), chunk)),
                    lambda read: (read["real"], read["chains"]))
        for rowids, real, chains in self._scanned(np.array(sorted(other_ids), "int64")):
            starts = [_FAR] + ([int(real["ts"].min())] if len(real["ts"]) else []) \
                + ([int(chains["ts"].min())] if len(chains["ts"]) else [])
            self.chunks.append(rowids)
            self.first_starts.append(min(starts))
            kept.add((real, chains))
            if not len(real["ts"]):
                continue
            family = self.family_code[real["api"]]
            if each_chunk is not None:
                each_chunk(real, family)
            # steps.memory_threads of the chunk, after those of the chunks before
            threads = distinct_pairs(real["pid"], real["tid"], 24, 0xFFFFFF)
            self.threads = pd.unique(np.concatenate([self.threads, threads]))
            self.first_ts = int(real["ts"].min()) if self.first_ts is None else min(self.first_ts, int(real["ts"].min()))
            finite = real["end"][real["end"] < _FAR]
            if len(finite):
                self.last_end = max(self.last_end if self.last_end is not None else int(finite.max()), int(finite.max()))
            latest_ends(real["pid"], real["end"], self.last_end_by_pid)
        if kept.complete:
            self._kept = kept
        else:
            kept.close()

    def _scanned(self, other_ids: np.ndarray) -> Iterator[tuple[tuple[int, int], dict, dict]]:
        """`read()`'s chunks, the rows of `other_ids` read with them and kept (`other_rows`: None
        when no memory call name is there to scan for, the caller reads them itself)."""
        self.other_rows = None
        if not len(other_ids) or not len(self._ids):
            yield from self.read()
            return
        parts = []
        ids = sorted({*self._ids.tolist(), *other_ids.tolist()})
        for rowids, raw in memory_call_chunks(self.conn, self.schema, ids, CALL_CHUNK_ROWIDS):
            found, memory = split_other_rows(raw, self._ids, other_ids)
            parts.append(found)
            yield rowids or _WHOLE, *self._converted(raw if memory is None else raw[memory])
        self.other_rows = pd.DataFrame({c: np.concatenate([p[c] for p in parts]) if parts else np.zeros(0, "int64")
                                        for c in OTHER_ROW_COLUMNS})

    def close(self) -> None:
        """Lets go of the chunks the scan kept (their file, if any)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    def read(self, chunks: Optional[list[int]] = None) -> Iterator[tuple[tuple[int, int], dict, dict]]:
        """(rowids, real calls, rows carrying a call stack) of each chunk, or of the given ones: as
        the scan kept them, else read from the table again (before a scan, or after a full disk)."""
        kept = self._kept
        if kept is not None:
            for i in range(len(self.chunks)) if chunks is None else chunks:
                real, chains = kept[i]
                yield self.chunks[i], dict(real), dict(chains)  # new dicts: readers add and take columns
            return
        ids = self._ids.tolist()
        if chunks is None:
            for rowids, raw in memory_call_chunks(self.conn, self.schema, ids, CALL_CHUNK_ROWIDS):
                yield rowids or _WHOLE, *self._converted(raw)
            return
        for i in chunks:
            rowids = self.chunks[i]
            for _, raw in memory_call_chunks(self.conn, self.schema, ids, rowids[1] - rowids[0] + 1,
                                             None if rowids == _WHOLE else rowids):
                yield rowids, *self._converted(raw)

    def read_ahead(self, order: list[int]) -> Iterator[tuple[int, dict, dict]]:
        """(chunk, real calls, rows carrying a call stack) of the given chunks in that order, the
        next one read on a second thread meanwhile (`read` would read each one on its own call)."""
        if self._kept is not None or _WHOLE in (self.chunks[i] for i in order):
            # kept by the scan, or a table not read by rowids (one chunk)
            for i in order:
                for _, real, chains in self.read([i]):
                    yield i, real, chains
            return
        raws = memory_call_ranges(self.conn, self.schema, self._ids.tolist(), [self.chunks[i] for i in order])
        for i, raw in zip(order, raws):
            yield i, *self._converted(raw)

    def _converted(self, raw: pd.DataFrame) -> tuple[dict, dict]:
        n = len(raw)
        if n == 0:
            return {c: np.zeros(0, "int64") for c in (*_REAL, "return_value")}, \
                {c: np.zeros(0, "int64") for c in (*_CHAIN, "ts", "tid")}
        columns = _call_columns(raw, self.schema, self._stacks)
        position = raw["position"].to_numpy().astype("int64")
        if self._stacks:
            position = position[pd.to_numeric(raw["event_class"], errors="coerce").fillna(0).to_numpy() != 67]
        name_id = columns["name_id"]  # the memory APIs' ids alone (memory_call_chunks' WHERE)
        if self._code_at is not None and len(name_id) and 0 <= name_id.min() and name_id.max() < len(self._code_at):
            api = self._code_at[name_id]
        else:
            api = self._code_of_id[np.clip(np.searchsorted(self._ids, name_id), 0, len(self._ids) - 1)]
        real = {"pid": columns["pid"].astype("int64"), "tid": columns["tid"], "correlation": columns["correlation_id"],
                "api": api.astype("int64"), "ts": columns["ts_ns"], "end": columns["end_ns"], "position": position,
                "return_value": columns["return_value"]}
        chains = {"pid": columns.get("chain_pid", np.zeros(0, "int32")).astype("int64"),
                  "correlation": columns.get("chain_correlation_id", np.zeros(0, "int64")),
                  "chain": columns.get("chain_callchain_id", np.zeros(0, "int64")),
                  "end": columns.get("chain_end_ns", np.zeros(0, "int64")),
                  "ts": columns.get("chain_ts_ns", np.zeros(0, "int64")),
                  "tid": columns.get("chain_tid", np.zeros(0, "int32")).astype("int64")}
        return real, chains

    def spans(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """What read.read_calls gives stacks.python_stack_table (ts_ns, end_ns, pid, tid and
        correlation_id of the calls, and of the call-stack rows per (pid, correlation id)), from
        the chunks the scan kept, in the same order: the API table is not read again whole."""
        parts = list(self.read())
        if not parts:
            columns = ("ts_ns", "end_ns", "pid", "tid", "correlation_id")
            return tuple(pd.DataFrame({c: np.zeros(0, "int64") for c in columns}) for _ in range(2))

        def frame(part: int) -> pd.DataFrame:
            rows = {c: np.concatenate([p[part][c] for p in parts]) for c in ("ts", "end", "pid", "tid", "correlation")}
            return pd.DataFrame({"ts_ns": rows["ts"], "end_ns": rows["end"], "pid": rows["pid"], "tid": rows["tid"],
                                 "correlation_id": rows["correlation"]})

        chains = frame(2).groupby(["pid", "correlation_id"], as_index=False).agg(
            tid=("tid", "first"), ts_ns=("ts_ns", "min"), end_ns=("end_ns", "max"))  # as read_calls groups them
        return frame(1), chains


class CallWindow:
    """Joins each batch of memory events to its API calls (see the module's docstring): per event
    the thread (`tid`, -1 without a call), the call's API (`api`, a code into calls.api_names, -1
    without a call) and its call stack (`chain`, -1 without one)."""

    def __init__(self, calls: MemoryCalls) -> None:
        self.calls = calls
        self.keep_all = False  # hold every call read (after an inexact flow)
        self.restart()

    def restart(self) -> None:
        self.real = {c: np.zeros(0, "bool" if c in ("ok_alloc", "matched") else "int64") for c in _HELD}
        self.chains = {c: np.zeros(0, "int64") for c in _CHAIN}
        starts = self.calls.first_starts
        # the chunks by their earliest start: the batches' times only grow, so each batch reads the
        # next few of them, which a reader reads ahead of it (self._reader)
        self.unread = sorted((i for i, start in enumerate(starts) if start < _FAR), key=lambda i: (starts[i], i))
        self._close_reader()
        self._reader = self.calls.read_ahead(self.unread) if self.unread else None
        # the calls of chunks read that start after the batches so far (_read_until): each chunk's
        # rows after its last that did, with their starts ("ts"), by their earliest start
        self.later: list[tuple[int, dict]] = []
        self.joined_allocations = 0  # successful allocation calls that caused an event (has_event), at the end
        self.lonely: list[tuple[np.ndarray, np.ndarray]] = []  # (pid, correlation) of events left without a call
        self.exact = True
        self.most_held = 0

    def join(self, batch) -> dict:
        n = len(batch.ts)
        if n == 0 or not self.calls:
            return {"tid": np.full(n, -1, "int32"), "api": np.full(n, -1, "int64"), "chain": np.full(n, -1, "int64")}
        self._move(int(batch.ts[0]), int(batch.ts[-1]))
        real = self.real
        row = join_on_call(batch.pid, batch.correlation, real["pid"], real["correlation"])
        found = row >= 0
        real["matched"][row[found]] = True
        lonely = ~found & (batch.correlation > 0)
        if lonely.any():
            self.lonely.append((batch.pid[lonely], batch.correlation[lonely]))
        chain = np.full(n, -1, "int64")
        if len(self.chains["pid"]):
            chain_row = join_on_call(batch.pid, batch.correlation, self.chains["pid"], self.chains["correlation"])
            chain = np.where(chain_row >= 0, self.chains["chain"][np.maximum(chain_row, 0)], -1)
        self.most_held = max(self.most_held, len(real["pid"]) + len(self.chains["pid"]))
        if not found.any():
            return {"tid": np.full(n, -1, "int32"), "api": np.full(n, -1, "int64"), "chain": chain}
        rows = np.maximum(row, 0)
        return {"tid": np.where(found, real["tid"][rows], -1).astype("int32"),
                "api": np.where(found, real["api"][rows], -1), "chain": chain}

    def _close_reader(self) -> None:
        reader, self._reader = getattr(self, "_reader", None), None
        if reader is not None:
            reader.close()  # waits for the chunk it is reading ahead, if any

    def finish(self) -> None:
        """After the last batch: the calls joined counted, and whether every event's call was in the window."""
        self._close_reader()
        self.joined_allocations += int((self.real["ok_alloc"] & self.real["matched"]).sum())
        if not self.lonely or self.keep_all:  # holding every call, the window missed none
            return
        pid = np.concatenate([p for p, _ in self.lonely])
        correlation = np.concatenate([c for _, c in self.lonely])
        wanted = pd.MultiIndex.from_arrays([pid, correlation]).unique()
        for _, real, _ in self.calls.read():
            if pd.MultiIndex.from_arrays([real["pid"], real["correlation"]]).isin(wanted).any():
                self.exact = False
                return

    def _move(self, first: int, last: int) -> None:
        """The window for events from `first` to `last`: without the calls that ended before
        `first` (all kept, holding every call), with those of every chunk that starts at or before
        `last` (every chunk, holding all)."""
        real, chains = self.real, self.chains
        gone = None
        if not self.keep_all:
            gone = real["end"] < first
            if gone.any():
                self.joined_allocations += int((gone & real["ok_alloc"] & real["matched"]).sum())
            else:
                gone = None
            ended = chains["end"] < first
            if ended.any():
                self.chains = {c: v[~ended] for c, v in chains.items()}
        added = self._read_until(last)
        if not (gone is not None or added):
            return
        if all(_increasing(part["position"]) for part in added):
            self.real = _rebuilt(real, None if gone is None else ~gone, added)
            return
        # a chunk not in rowid order (a table read as one frame): the window sorted whole
        window = {c: np.concatenate([v if gone is None else v[~gone]] + [part[c] for part in added])
                  for c, v in real.items()}
        order = np.argsort(window["position"], kind="stable")  # the first call of a key (in rowid order) wins
        self.real = {c: v[order] for c, v in window.items()}

    def _read_until(self, ts: int) -> list[dict]:
        """The calls not in the window yet of every chunk with a call starting at or before `ts`
        (every chunk, holding all), a dict of _HELD per piece of a chunk in rowid order; their
        call stacks put in the window. Of a chunk, the rows up to its last call that starts by
        `ts` (a range of rowids): those after wait in `later` for the batch that reaches their
        earliest start, out of the window each batch's join searches and copies (at 1e7 events
        the window held a chunk of each of 4 ranks ahead of the batch: twice the batch's calls)."""
        starts = self.calls.first_starts
        count = len(self.unread) if self.keep_all else int(np.searchsorted(
            np.array([starts[i] for i in self.unread], "int64"), ts, side="right"))
        due = [part for start, part in self.later if start <= ts]
        if not count and not due:
            return []
        self.later = [(start, part) for start, part in self.later if start > ts]
        wanted, self.unread = self.unread[:count], self.unread[count:]
        read = {}
        for _ in wanted:
            i, real, chains = next(self._reader)
            read[i] = real, chains
        alloc = self.calls.families.index("alloc") if "alloc" in self.calls.families else -1
        real_parts, chain_parts = due, [self.chains]
        for i in sorted(wanted):  # in rowid order
            real, chains = read.pop(i)
            real["ok_alloc"] = (self.calls.family_code[real["api"]] == alloc) & (real.pop("return_value") == 0)
            real["matched"] = np.zeros(len(real["pid"]), bool)
            real_parts.append({c: real[c] for c in (*_HELD, "ts")})
            chain_parts.append({c: chains[c] for c in _CHAIN})
        if wanted:
            chains = {c: np.concatenate([p[c] for p in chain_parts]) for c in _CHAIN}
            # normalize takes the largest stack id of a call's rows: first in this order
            order = np.lexsort((-chains["chain"], chains["correlation"], chains["pid"]))
            self.chains = {c: v[order] for c, v in chains.items()}
        added = []
        for part in real_parts:
            started = np.flatnonzero(part["ts"] <= ts)
            cut = len(part["ts"]) if self.keep_all else int(started[-1]) + 1 if len(started) else 0
            if cut < len(part["ts"]):
                rest = {c: v[cut:] for c, v in part.items()}
                self.later.append((int(rest["ts"].min()), rest))
            if cut:
                added.append({c: part[c][:cut] for c in _HELD})
        return sorted(added, key=lambda part: int(part["position"][0]))  # in rowid order


def _increasing(position: np.ndarray) -> bool:
    return bool((position[1:] > position[:-1]).all())


def _rebuilt(window: dict, keep: Optional[np.ndarray], added: list[dict]) -> dict:
    """The window's calls (those `keep` marks; all for None) and the `added` chunks' in one
    rowid order (the first call of a key wins, as in normalize.join_on_call), each row copied
    once. Each chunk holds a range of rowids that no other holds, in rowid order: its calls go
    in one piece, before the window's first call after its first rowid (the chunks come by
    their earliest start, a later one often before calls already held: a sort of the whole
    window each time it was out of order)."""
    position = window["position"]
    at = [int(np.searchsorted(position, part["position"][0])) for part in added]
    bounds = [0, *at, len(position)]
    if keep is None:
        sizes = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    else:
        held = np.concatenate([[0], np.cumsum(keep)])
        sizes = [int(held[b] - held[a]) for a, b in zip(bounds[:-1], bounds[1:])]
    rows = sum(sizes) + sum(len(part["position"]) for part in added)
    rebuilt = {}
    for c, values in window.items():
        out = np.empty(rows, values.dtype)
        filled = 0
        for piece, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            if keep is None:
                out[filled:filled + sizes[piece]] = values[a:b]
            elif sizes[piece]:
                np.compress(keep[a:b], values[a:b], out=out[filled:filled + sizes[piece]])
            filled += sizes[piece]
            if piece < len(added):
                part = added[piece][c]
                out[filled:filled + len(part)] = part
                filled += len(part)
        rebuilt[c] = out
    return rebuilt
