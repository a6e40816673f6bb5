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


def table_order(path: str, chunk_rowids: int, most: int) -> tuple[Optional[list], Optional[list]]:
    """(runs, first starts) as EventFlow finds them when the probes see time go back (runs: [] when
    more than `most`, then each chunk's earliest start); (None, None) when they do not."""
    conn = connect_readonly(path)
    try:
        if not memory_chunks_look_unordered(conn, chunk_rowids):
            return None, None
        runs = memory_sorted_runs(conn, chunk_rowids, most) or []
        return runs, None if runs else memory_chunk_first_starts(conn, chunk_rowids)
    finally:
        conn.close()


def memory_chunks_look_unordered(conn: sqlite3.Connection, chunk_rowids: int) -> bool:
    """Whether the memory rows go back in time, as far as `start` at every 16th of a chunk of
    memory_event_chunks says (one b-tree descent each): an export written rank by rank shows it at
    once, where the one scan would find it only at the second rank, its batches so far wasted.
    False when the rowid cannot be used or the probes find no step back."""
    if not reads_in_chunks(conn, MEMORY_TABLE):
        return False
    try:
        (low,) = conn.execute(f"SELECT min(rowid) FROM {MEMORY_TABLE}").fetchone()
        (high,) = conn.execute(f"SELECT max(rowid) FROM {MEMORY_TABLE}").fetchone()
        if not isinstance(low, int) or not isinstance(high, int):
            return False
        # probes a run longer than this many rows cannot hide between (some 10^5 probes at most)
        every = max(chunk_rowids // 16, (high - low) // 100_000, 1)
        firsts = ",".join(str(r) for r in range(low, high + 1, every))
        starts = [s for (s,) in conn.execute(
            f"SELECT start FROM {MEMORY_TABLE} WHERE rowid IN ({firsts}) ORDER BY rowid")]
    except sqlite3.Error:
        return False
    # a NULL or odd start is a bad row, which breaks no order
    known = [s for s in starts if isinstance(s, (int, float)) and not isinstance(s, bool) and s == s]
    return any(b < a for a, b in zip(known, known[1:]))
