"""Adversarial rows: tables nsys never writes, built from real captures, where the one-batch
(whole frame) and many-batch (streamed) analyses must give one answer, or both refuse.

docs/reliability.md ("Adversarial rows and the two paths") lists each case with its test.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import FIXTURES
from test_bounded_memory import full_documents

from nsysan import pipeline
from nsysan.reader import chunk_grid
from nsysan.render.json import render_json

MEMORY = "CUDA_GPU_MEMORY_USAGE_EVENTS"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"


def without_source(document: dict) -> dict:
    return {k: v for k, v in document.items() if k != "source"}


@pytest.fixture(scope="module")
def torch_leak_document() -> dict:
    return json.loads(render_json(pipeline.analyze_report(FIXTURES / "torch_leak_v25.sqlite", keep_events=True)))


# --- rowids that jump --------------------------------------------------------------------------------

ROWID_MOVES = {
    # (table, the row moved: its rowid or "last", where to)
    "the memory table's last row at rowid 2^32": (MEMORY, "last", 2**32),
    "the API table's last row at rowid 2^32": (RUNTIME, "last", 2**32),
    "a memory row in the middle at rowid 3e7": (MEMORY, 700, 30_000_000),
    "the API table ending at 2^40 (a span SQLite's rowid holds, no array could)": (RUNTIME, "last", 2**40),
}


@pytest.mark.parametrize("case", sorted(ROWID_MOVES))
def test_a_row_moved_far_changes_nothing_and_costs_nothing(case, tmp_path, monkeypatch, torch_leak_document):
    """torch_leak_v25 with one row's rowid changed (its place in rowid order unchanged, or moved
    past the others at the same time): the same document on both paths as the fixture's. Before,
    a table ending at rowid 2^32 was read in 4,096 (whole frame) or 16,384 (streamed) chunks of
    empty rowids: 21 s and 59 s for 7,000 rows."""
    table, row, to = ROWID_MOVES[case]
    path = tmp_path / "moved.sqlite"
    shutil.copyfile(FIXTURES / "torch_leak_v25.sqlite", path)
    with sqlite3.connect(path) as conn:
        row = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] if row == "last" else row
        start = conn.execute(f"SELECT start FROM {table} WHERE rowid = ?", (row,)).fetchone()[0]
        later = conn.execute(f"SELECT count(*) FROM {table} WHERE rowid > ? AND start < ?", (row, start)).fetchone()[0]
        conn.execute(f"UPDATE {table} SET rowid = ? WHERE rowid = ?", (to, row))
        rows = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    started = time.perf_counter()
    whole, streamed = full_documents(path, 1 << 18, monkeypatch)
    seconds = time.perf_counter() - started
    assert streamed == whole
    if later == 0:  # the row kept its place in time order: the analysis can't tell
        assert without_source(whole) == without_source(torch_leak_document)
    with sqlite3.connect(path) as conn:  # as many chunks as the rows fill, however far the rowids jump
        low = conn.execute(f"SELECT min(rowid) FROM {table}").fetchone()[0]
        assert len(chunk_grid(conn, table, low, to, 1 << 18)) <= rows // (1 << 18) + 2
    assert seconds < 60  # both analyses; minutes before (a few seconds on an idle machine)
