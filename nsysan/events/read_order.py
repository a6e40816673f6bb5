"""The memory table's order, found before the streamed flow reads it (stream.py): a cheap look,
and when it sees time go back, the time-ordered runs, on a second thread while the API table is
scanned (`order_ahead`)."""

from __future__ import annotations

import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

from ..sources.reader import database_path, reads_in_chunks
from ..sources.schema import connect_readonly
from .read import MEMORY_TABLE, memory_chunk_first_starts, memory_sorted_runs


def order_ahead(conn: sqlite3.Connection, chunk_rowids: int, most: int) -> Optional[Future]:
    """`table_order` of the file behind `conn`, found on a thread of its own through a connection
    of its own, for EventFlow.feed to take: both reads (the probes, then (rowid, start) of every
    row, some 4 s at 1e7 events) go on while the caller scans the API table. None without a file."""
    path = database_path(conn)
    if path is None:
        return None
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(table_order, path, chunk_rowids, most)
    finally:
        pool.shutdown(wait=False)


def table_order(path: str, chunk_rowids: int, most: int) -> tuple[Optional[list], Optional[list], bool]:
    """(runs, first starts, guessed) as EventFlow finds them when the probes see time go back (runs:
    [] when more than `most`, then each chunk's earliest start); (None, None, False) when they do
    not. `guessed`: the runs are where the probes saw steps back (runs_at_steps), which the flow
    checks as it reads them, instead of (rowid, start) of every row read first (1.4 s of CPU at
    1e7 events)."""
    conn = connect_readonly(path)
    try:
        probes = _probes(conn, chunk_rowids)
        if not _goes_back(probes):
            return None, None, False
        runs = runs_at_steps(conn, probes, most)
        if runs is not None:
            return runs, None, True
        runs = memory_sorted_runs(conn, chunk_rowids, most) or []
        return runs, None if runs else memory_chunk_first_starts(conn, chunk_rowids), False
    finally:
        conn.close()


def memory_chunks_look_unordered(conn: sqlite3.Connection, chunk_rowids: int) -> bool:
    """Whether the memory rows go back in time, as far as `start` at every 16th of a chunk of
    memory_event_chunks says (one b-tree descent each): an export written rank by rank shows it at
    once, where the one scan would find it only at the second rank, its batches so far wasted.
    False when the rowid cannot be used or the probes find no step back."""
    return _goes_back(_probes(conn, chunk_rowids))


def _probes(conn: sqlite3.Connection, chunk_rowids: int) -> list[tuple[int, object]]:
    """(rowid, start) at every 16th of a chunk (memory_chunks_look_unordered); none when the
    rowid cannot be used."""
    if not reads_in_chunks(conn, MEMORY_TABLE):
        return []
    try:
        (low,) = conn.execute(f"SELECT min(rowid) FROM {MEMORY_TABLE}").fetchone()
        (high,) = conn.execute(f"SELECT max(rowid) FROM {MEMORY_TABLE}").fetchone()
        if not isinstance(low, int) or not isinstance(high, int):
            return []
        # probes a run longer than this many rows cannot hide between (some 10^5 probes at most)
        every = max(chunk_rowids // 16, (high - low) // 100_000, 1)
        firsts = ",".join(str(r) for r in range(low, high + 1, every))
        return conn.execute(f"SELECT rowid, start FROM {MEMORY_TABLE} WHERE rowid IN ({firsts}) ORDER BY rowid").fetchall()
    except sqlite3.Error:
        return []


def _known(start: object) -> bool:
    # a NULL or odd start is a bad row, which breaks no order
    return isinstance(start, (int, float)) and not isinstance(start, bool) and start == start


def _goes_back(probes: list[tuple[int, object]]) -> bool:
    known = [s for _, s in probes if _known(s)]
    return any(b < a for a, b in zip(known, known[1:]))


def runs_at_steps(conn: sqlite3.Connection, probes: list[tuple[int, object]], most: int) -> Optional[list]:
    """The runs memory_sorted_runs finds, if the steps back are those the probes see: each found
    in the rows between the two probes around it; EventFlow checks that each run's rows go on in
    time order as it reads them, and finds the runs from every row when one does not. None when
    a start read is not an integer (memory_sorted_runs reads such values its own way) or the
    steps are `most` or more (the runs too many)."""
    if any(type(start) is not int for _, start in probes if start is not None):
        return None
    known = [(rowid, start) for rowid, start in probes if start is not None]
    steps = []
    try:
        for (after, last), (until, start) in zip(known, known[1:]):
            if start >= last:
                continue
            between = conn.execute(f"SELECT rowid, start FROM {MEMORY_TABLE} WHERE rowid > ? AND rowid <= ? "
                                   "ORDER BY rowid", (after, until))
            for rowid, start in between:  # each step back: the first row of a run
                if start is None:  # a bad row: in the run before a step back after it, as memory_sorted_runs puts it
                    continue
                if type(start) is not int:
                    return None
                if start < last:
                    steps.append(rowid)
                last = start
            if len(steps) >= most:
                return None
        (low,) = conn.execute(f"SELECT min(rowid) FROM {MEMORY_TABLE}").fetchone()
        (high,) = conn.execute(f"SELECT max(rowid) FROM {MEMORY_TABLE}").fetchone()
    except sqlite3.Error:
        return None
    firsts = [low, *steps]
    return [(first, following - 1) for first, following in zip(firsts, firsts[1:])] + [(firsts[-1], high)]
