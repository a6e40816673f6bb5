"""The time-ordered runs of an export written rank by rank, as the streamed full analysis finds them
before it reads the memory table (read_order.table_order): where the probes (a row every 16th of a
chunk) see time go back, the rows between the two probes around each step say where it is, and the
flow checks that each run's rows go on in time order as it reads them; a step back that hides
between two probes sends it back to the runs found from every row (read.memory_sorted_runs)."""

from __future__ import annotations

import sqlite3

from conftest import FIXTURES
from test_bounded_memory import SHUFFLED_TABLES, assert_streamed_full_is_whole, chunk_rowids, dealt_calls_copy, \
    full_documents

from nsysan.events import read, read_order, stream

MEMORY = SHUFFLED_TABLES[0]


def runs_scans(monkeypatch) -> list:
    """The list that fills with each read of (rowid, start) of every memory row."""
    scans: list = []
    for module in (read_order, stream):
        monkeypatch.setattr(module, "memory_sorted_runs",
                            lambda *args: scans.append(args) or read.memory_sorted_runs(*args))
    return scans


def test_the_runs_are_found_where_the_probes_see_time_go_back(tmp_path, monkeypatch):
    path = dealt_calls_copy(FIXTURES / "ddp_leak_v25.sqlite", tmp_path / "ddp.sqlite", 3)
    chunk = chunk_rowids(path)  # 454 rowids: a probe every 28 rows of 4,548
    with sqlite3.connect(path) as conn:
        runs = read.memory_sorted_runs(conn, chunk, stream.MOST_RUNS)
        first_starts = read.memory_chunk_first_starts(conn, chunk)
    assert runs == [(1, 1516), (1517, 3032), (3033, 4548)]
    assert read_order.table_order(str(path), chunk, stream.MOST_RUNS) == (runs, None, True)
    # at most 2 runs: too many, found from every row as before (then each chunk's earliest start)
    assert read_order.table_order(str(path), chunk, 2) == ([], first_starts, False)
    scans = runs_scans(monkeypatch)
    whole, streamed = full_documents(path, chunk, monkeypatch)
    assert_streamed_full_is_whole(whole, streamed)
    assert scans == []  # the runs guessed held: no row read twice to find them


def test_a_step_back_between_two_probes_sends_the_flow_to_the_runs_of_every_row(tmp_path, monkeypatch):
    path = dealt_calls_copy(FIXTURES / "ddp_leak_v25.sqlite", tmp_path / "ddp.sqlite", 2)
    chunk = chunk_rowids(path)
    with sqlite3.connect(path) as conn:
        # rows 101 and 102 (no probe: those are every 28th from row 1) swap their times
        (a,), (b,) = conn.execute(f"SELECT start FROM {MEMORY} WHERE rowid IN (101, 102) ORDER BY rowid").fetchall()
        assert a < b
        conn.executemany(f"UPDATE {MEMORY} SET start = ? WHERE rowid = ?", [(b, 101), (a, 102)])
        conn.commit()
        runs = read.memory_sorted_runs(conn, chunk, stream.MOST_RUNS)
    assert runs == [(1, 101), (102, 2274), (2275, 4548)]
    guessed = read_order.table_order(str(path), chunk, stream.MOST_RUNS)
    assert guessed == ([(1, 2274), (2275, 4548)], None, True)  # the probes saw one step back of two
    scans = runs_scans(monkeypatch)
    whole, streamed = full_documents(path, chunk, monkeypatch)
    assert_streamed_full_is_whole(whole, streamed)
    assert len(scans) == 1  # the first run went back in time as read: the runs from every row, once
