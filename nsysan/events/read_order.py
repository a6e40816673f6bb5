"""A cheap look at the memory table's order before the streamed flow reads it (stream.py)."""

from __future__ import annotations

import sqlite3

from ..reader import reads_in_chunks
from .read import MEMORY_TABLE


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
