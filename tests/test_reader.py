"""Reading in rowid ranges on several threads gives exactly what one scan gives, whatever the
table looks like; and the helpers of the normalizing stage agree with plain Python."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import FIXTURES
from hypothesis import given, settings
from hypothesis import strategies as st

from nsysan.sources import reader
from nsysan.events.arrays import factorize_in_parts, previous_in_group
from nsysan.sources.schema import open_readonly

MEMORY_SELECT = ("start, globalPid, deviceId, address, bytes, memKind, memoryOperationType, correlationId, "
                 "localMemoryPoolAddress IS NOT NULL")
MEMORY_COLUMNS = ["start", "global_pid", "device", "address", "bytes", "kind", "op", "correlation", "pool"]


@pytest.fixture
def split_every_table(monkeypatch):
    """Tables of any size are read in ranges (normally only those of 10,000 rows or more)."""
    monkeypatch.setattr(reader, "PARALLEL_MIN_ROWS", 1)


def one_scan(path: Path, sql: str, columns: list[str]) -> pd.DataFrame:
    with contextlib.closing(open_readonly(path)) as conn:
        return reader.read_frame(conn, sql, columns)


def in_ranges(path: Path, table: str, select: str, columns: list[str], where: str = "",
              workers: int = 3) -> pd.DataFrame:
    with contextlib.closing(open_readonly(path)) as conn:
        return reader.read_table(conn, table, select, columns, where=where, workers=workers)


@pytest.mark.parametrize("workers", [1, 2, 3, 7])
def test_memory_table_in_ranges_equals_one_scan(split_every_table, workers):
    path = FIXTURES / "torch_leak_v25.sqlite"
    whole = one_scan(path, f"SELECT {MEMORY_SELECT} FROM CUDA_GPU_MEMORY_USAGE_EVENTS", MEMORY_COLUMNS)
    assert len(whole) == 1378
    split = in_ranges(path, "CUDA_GPU_MEMORY_USAGE_EVENTS", MEMORY_SELECT, MEMORY_COLUMNS, workers=workers)
    pd.testing.assert_frame_equal(split, whole)


def test_filtered_api_table_in_ranges_equals_one_scan(split_every_table):
    path = FIXTURES / "known_bt_v25.sqlite"
    select, columns = "start, globalTid, nameId, callchainId", ["start", "tid", "name", "chain"]
    where = "nameId IN (SELECT id FROM StringIds WHERE value LIKE 'cudaMalloc%')"
    whole = one_scan(path, f"SELECT {select} FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE {where}", columns)
    assert 0 < len(whole) and whole["chain"].isna().any()  # gaps between ranges, and NULLs
    pd.testing.assert_frame_equal(in_ranges(path, "CUPTI_ACTIVITY_KIND_RUNTIME", select, columns, where), whole)


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_filtered_api_table_converted_in_chunks_equals_one_scan(monkeypatch, chunk):
    # The chunks' converted columns are written into room for every rowid: the calls' fewer rows
    # must come out whole, in order, with nothing of the room they did not fill.
    monkeypatch.setattr(reader, "CHUNK_ROWIDS", chunk)
    monkeypatch.setattr(reader, "SPLIT_MIN_ROWIDS", 1)
    path = FIXTURES / "known_bt_v25.sqlite"
    select, columns = "start, globalTid, nameId", ["start", "tid", "name"]
    where = "nameId IN (SELECT id FROM StringIds WHERE value LIKE 'cudaMalloc%')"
    whole = one_scan(path, f"SELECT {select} FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE {where}", columns)

    def convert(raw: pd.DataFrame) -> dict[str, np.ndarray]:
        return {"start": raw["start"].to_numpy("int64"), "tid": (raw["tid"].to_numpy("int64") & 0xFFFFFF).astype("int32"),
                "late": raw["start"].to_numpy("int64") > whole["start"].median()}

    with contextlib.closing(open_readonly(path)) as conn:
        spans = conn.execute("SELECT max(rowid) - min(rowid) + 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        read = reader.read_converted(conn, "CUPTI_ACTIVITY_KIND_RUNTIME", select, columns, convert, where=where)
    assert 0 < len(whole) < spans / 2  # the WHERE leaves most rowids out
    assert list(read) == ["start", "tid", "late"]
    assert read["start"].tolist() == whole["start"].tolist()
    assert read["tid"].dtype == "int32" and read["tid"].tolist() == (whole["tid"] & 0xFFFFFF).tolist()
    assert read["late"].tolist() == (whole["start"] > whole["start"].median()).tolist()


def _odd_table(path: Path, ddl: str, rows: list[tuple]) -> Path:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute(ddl)
        conn.executemany(f"INSERT INTO t VALUES ({', '.join('?' * len(rows[0]))})", rows)
        conn.commit()
    return path


@pytest.mark.parametrize("ddl, rows", [
    # rowids far apart: the arrays are sized for the span but only the rows are kept
    ("CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b INTEGER)", [(1, 5, 6), (2**40, 7, 8), (2**41, 9, 10)]),
    # a column named rowid hides the real one: read in one scan
    ("CREATE TABLE t (rowid INTEGER, a INTEGER, b INTEGER)", [(None, 1, 2), (None, 3, 4), (7, 5, 6)]),
    # no rowid at all
    ("CREATE TABLE t (id INTEGER PRIMARY KEY, a INTEGER, b INTEGER) WITHOUT ROWID", [(1, 1, 2), (2, 3, 4)]),
    # NULLs in one range only, text in another
    ("CREATE TABLE t (id INTEGER PRIMARY KEY, a, b INTEGER)", [(1, 1, None), (2, 2, 3), (3, "x", 4), (4, 4, 5)]),
])
def test_odd_tables_in_ranges_equal_one_scan(split_every_table, tmp_path, ddl, rows):
    path = _odd_table(tmp_path / "odd.sqlite", ddl, rows)
    whole = one_scan(path, "SELECT a, b FROM t", ["a", "b"])
    split = in_ranges(path, "t", "a, b", ["a", "b"])
    assert len(split) == len(rows)

    def as_numbers(frame: pd.DataFrame) -> list:
        # A column mixing integers and text may come back as text from one scan and partly as
        # integers from ranges; nsysan reads these columns as numbers (events._ints), and those agree.
        return [pd.to_numeric(frame[c].astype(object), errors="coerce").tolist() for c in frame]

    assert str(as_numbers(split)) == str(as_numbers(whole))


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 5), max_size=60), st.integers(6, 8))
def test_previous_in_group_is_the_last_row_of_the_same_code(codes, groups):
    last: dict[int, int] = {}
    expected = []
    for row, code in enumerate(codes):
        expected.append(last.get(code, -1))
        last[code] = row
    assert previous_in_group(np.array(codes, dtype="int64"), groups).tolist() == expected


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 2**63 - 1) | st.sampled_from([0, 1, 2**48]), max_size=80))
def test_factorize_in_parts_numbers_equal_values_alike(values):
    usual = reader.PARALLEL_MIN_ROWS
    import nsysan.events.arrays as arrays
    arrays.PARALLEL_MIN_ROWS = 1  # split even the smallest input
    try:
        array = np.array(values, dtype="uint64")
        codes, uniques = factorize_in_parts(array)
    finally:
        arrays.PARALLEL_MIN_ROWS = usual
    assert len(set(uniques.tolist())) == len(uniques) == len(set(values))
    assert uniques[codes].tolist() == values


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=300), st.integers(0, 3))
def test_a_reordering_applied_in_place_equals_the_gather(keys, swaps):
    from nsysan.events.normalize import _moved_rows, _permuted

    key = np.sort(np.array(keys, dtype="int64"))
    for i in range(min(swaps, len(key) - 1)):  # nearly sorted, as exports are
        key[i], key[-1 - i] = key[-1 - i], key[i]
    order = np.argsort(key, kind="stable")
    values = np.arange(len(key), dtype="int64") * 10
    # a column as pandas hands it out: a read-only view of data nothing else reads any more
    column = pd.DataFrame({"v": values.copy()}, copy=False)["v"].to_numpy()
    assert not column.flags.writeable
    assert _permuted(column, order, _moved_rows(order)).tolist() == values[order].tolist()


def test_the_command_line_process_runs_without_transparent_huge_pages():
    status = Path("/proc/self/status")
    if not status.exists() or "THP_enabled" not in status.read_text():
        pytest.skip("no per-process THP setting to read here (not Linux, or a kernel before 5.0)")
    import subprocess
    import sys

    # What cli.run() sets up, in a process of its own (the setting is inherited, never undone).
    code = ("from nsysan.runtime.malloc_tuning import avoid_transparent_huge_pages; avoid_transparent_huge_pages(); "
            "print(open('/proc/self/status').read())")
    printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "THP_enabled:\t0" in printed
    assert "THP_enabled:\t1" in status.read_text()  # the test process itself keeps the system's setting


@pytest.mark.parametrize("known", ["all", "one", "extra"])
def test_last_call_per_process_in_one_scan_equals_the_group_by(known):
    """read._last_ends (one max() per process with memory calls in a single scan) gives the GROUP
    BY's answer on ddp_leak_v25 (three processes), also when a process of the table is not among
    those named (it then runs the GROUP BY) or one named has no row."""
    from nsysan.events.read import _last_ends

    table = "CUPTI_ACTIVITY_KIND_RUNTIME"
    with contextlib.closing(open_readonly(FIXTURES / "ddp_leak_v25.sqlite")) as conn:
        expected = conn.execute(f'SELECT (globalTid >> 24) & 16777215, max("end") FROM {table} GROUP BY 1').fetchall()
        pids = [pid for pid, _ in expected]
        named = {"all": pids, "one": pids[:1], "extra": [*pids, 1]}[known]
        assert len(pids) == 3 and all(isinstance(ts, int) for _, ts in expected)
        assert sorted(_last_ends(conn, table, '"end"', "", sorted(named))) == sorted(expected)
