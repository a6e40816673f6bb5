"""A fraction where nsys writes integers (1.5 bytes, a time between two nanoseconds) is an
unreadable value, left out with the bad_memory_rows diagnostic on both paths, never truncated
into a number that looks real (issue 28, text and REAL in numeric columns)."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest
from conftest import FIXTURES, cli


@pytest.mark.parametrize("column", ["bytes", "start"])
def test_a_fraction_in_a_memory_row_is_left_out_the_same_on_both_paths(column, tmp_path, capsys):
    path = tmp_path / "fraction.sqlite"
    shutil.copy(FIXTURES / "known_mem_v25.sqlite", path)
    with sqlite3.connect(path) as conn:
        rowid = conn.execute("SELECT rowid FROM CUDA_GPU_MEMORY_USAGE_EVENTS ORDER BY rowid LIMIT 1 OFFSET 5").fetchone()[0]
        conn.execute(f"UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET {column} = {column} + 0.5 WHERE rowid = ?", (rowid,))
    documents = []
    for extra in ([], ["--max-memory", "0"]):  # the whole frame, then streamed
        code, out, err = cli(capsys, "analyze", str(path), "--format", "json", *extra)
        assert code == 0, err
        documents.append(json.loads(out))
    said = [d["message"] for d in documents[0]["diagnostics"] if d["code"] == "bad_memory_rows"]
    assert said == ["1 memory events had missing or impossible values and were left out: 1 with a missing or "
                    "unreadable time, process, address, size or operation (NULL, text, REAL)"]
    assert documents[0]["groups"] == documents[1]["groups"] and documents[0]["diagnostics"] == documents[1]["diagnostics"]
