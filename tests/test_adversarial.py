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

from nsysan.pipeline import stages as pipeline
from nsysan.sources.reader import chunk_grid
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


# --- adversarial row kinds: one answer on both paths ---------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from builders import PID, make_export  # noqa: E402
from nsysan.events import stream, stream_calls  # noqa: E402

# Row kinds nsys never writes, each with whether normalize must leave the row out (a bad row).
# "stamped early": an allocation's free (or any row) stamped before rows written ahead of it;
# "address 0": every such row at one address, so allocations overlap; device -1 is kept as a
# device of its own (never merged with device 0), 70000 and 2^40 do not fit a device id.
UNREADABLE = "a missing or unreadable time, process, address, size or operation (NULL, text, REAL)"
SIZE, TIME, DEVICE = "a size below 0 or above 1 PiB", "a time beyond ±2^61 ns", "a device id below -1 or above 32767"
ROW_KINDS = {  # kind: why the row is left out (None: it is kept)
    "normal": None, "negative size": SIZE, "size over 1 PiB": SIZE, "text size": UNREADABLE, "size 0": None,
    "stamped early": None, "stamped at 0": None, "address 0": None, "device -1": None,
    "device 70000": DEVICE, "device 2^40": DEVICE, "start 2^63-1": TIME, "start -2^63": TIME,
    "start 2^62": TIME, "text start": UNREADABLE, "same time as the last": None,
}


def adversarial_rows(kinds: list[str], frees: list[bool]) -> tuple[list[tuple], list[tuple], list[str]]:
    """Memory rows (and their API calls) of allocations and frees, each altered by its kind;
    returns them and why each bad row is left out."""
    memory, calls, live, bad = [], [], [], []
    t = 1000
    for i, (kind, free) in enumerate(zip(kinds, frees)):
        t += 0 if kind == "same time as the last" else 1000
        corr = 10 + i
        if free and live:
            address, size = live.pop(0)
            op = 1
        else:
            address, size, op = 0x100000 * (i + 1), (i % 4 + 1) << 20, 0
            live.append((address, size))
        row = [t, address, size, op, corr, 2, PID, 0]
        field, value = {"negative size": (2, -size), "size over 1 PiB": (2, 2**50 + 1), "text size": (2, "big"),
                        "size 0": (2, 0), "stamped early": (0, max(t - 5000, 1)), "stamped at 0": (0, 0),
                        "address 0": (1, 0), "device -1": (7, -1), "device 70000": (7, 70000),
                        "device 2^40": (7, 2**40), "start 2^63-1": (0, 2**63 - 1), "start -2^63": (0, -2**63),
                        "start 2^62": (0, 2**62), "text start": (0, "soon")}.get(kind, (None, None))
        if field is not None:
            row[field] = value
        bad += [ROW_KINDS[kind]] if ROW_KINDS[kind] else []
        memory.append(tuple(row))
        calls.append((t, t + 5, "cudaFree_v3020" if op else "cudaMalloc_v3020", corr))
    return memory, calls, bad


def both_paths(path: Path, quick: bool, chunk: int) -> tuple[dict, dict]:
    """The document of `path` from the whole frame, and streamed in batches of `chunk` rowids."""
    whole = json.loads(render_json(pipeline.analyze_report(path, keep_events=True, quick=quick)))
    saved = pipeline.STREAM_QUICK_FROM_ROWS, stream.CHUNK_ROWIDS, stream_calls.CALL_CHUNK_ROWIDS
    pipeline.STREAM_QUICK_FROM_ROWS, stream.CHUNK_ROWIDS, stream_calls.CALL_CHUNK_ROWIDS = 1, chunk, chunk
    try:
        streamed = json.loads(render_json(pipeline.analyze_report(path, keep_events=False, quick=quick)))
    finally:
        pipeline.STREAM_QUICK_FROM_ROWS, stream.CHUNK_ROWIDS, stream_calls.CALL_CHUNK_ROWIDS = saved
    return whole, streamed


def assert_one_answer(whole: dict, streamed: dict, bad: list[str]) -> None:
    assert without_source(streamed) == without_source(whole)
    for peak in whole["peaks"]:  # "live at the peak" holds what was allocated by then, and not yet freed
        for allocation in peak["live_at_peak"]:
            assert allocation["alloc_time_ns"] <= peak["peak_time_ns"]
    said = [d["message"] for d in whole["diagnostics"] if d["code"] == "bad_memory_rows"
            and "missing or impossible values" in d["message"]]
    # each bad row named by why it was left out, the reasons in their fixed order
    reasons = [why for why in (UNREADABLE, "an unknown operation", SIZE, TIME, DEVICE) if why in bad]
    assert said == ([f"{len(bad)} memory events had missing or impossible values and were left out: "
                     + "; ".join(f"{bad.count(why)} with {why}" for why in reasons)] if bad else [])


@pytest.mark.slow  # 30 tables, each analyzed 2 or 3 ways: about 6 CPU s
@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(kinds=st.lists(st.sampled_from(sorted(ROW_KINDS)), min_size=1, max_size=24),
       frees=st.lists(st.booleans(), min_size=24, max_size=24), chunk=st.sampled_from([1, 2, 3, 7]),
       quick=st.booleans(), gap=st.sampled_from([0, 0, 1000, 30_000_000, 2**32]), cut=st.integers(0, 24),
       table=st.sampled_from([MEMORY, RUNTIME]))
def test_adversarial_rows_give_one_answer_on_both_paths(kinds, frees, chunk, quick, gap, cut, table,
                                                        tmp_path_factory):
    """Hypothesis over the row kinds (not only over shuffles), and a rowid gap in the memory or
    the API table (the rows after `cut` moved `gap` rowids on, their order kept): the whole frame
    and the streamed batches give one document, name the bad rows alike, and list at a peak
    nothing made after it; the gap changes nothing."""
    memory, calls, bad = adversarial_rows(kinds, frees)
    path = make_export(tmp_path_factory.mktemp("rows") / "rows.sqlite", memory=memory, calls=calls)
    before = json.loads(render_json(pipeline.analyze_report(path, keep_events=True, quick=quick))) if gap else None
    if gap:
        with sqlite3.connect(path) as conn:  # highest first: no rowid is ever taken twice
            for (rowid,) in conn.execute(f"SELECT rowid FROM {table} WHERE rowid > ? ORDER BY rowid DESC",
                                         (cut,)).fetchall():
                conn.execute(f"UPDATE {table} SET rowid = ? WHERE rowid = ?", (rowid + gap, rowid))
    whole, streamed = both_paths(path, quick, chunk)
    assert_one_answer(whole, streamed, bad)
    if gap:
        assert without_source(whole) == without_source(before)


NAMED = {
    # every memory row bad: the streamed path crashed (exit 3) where the whole frame says so
    "every row bad": (["negative size", "text start", "device 70000", "start 2^63-1"], [False] * 4, 4),
    # an allocation at an address another takes later, made after the peak, was listed at it
    "address 0 after the peak": (["normal", "normal", "normal", "normal", "address 0", "address 0", "normal",
                                  "address 0"], [False, False, False, True, True, False, True, False], 0),
    # |-2^63| wraps to -2^63 in int64: the row was kept, and overflowed the streamed timeline
    "start -2^63": (["normal", "start -2^63", "normal", "normal"], [False, False, True, False], 1),
    # device -1 was listed as device 65535 by the whole frame, -1 by the streamed path
    "device -1": (["normal", "device -1", "normal"], [False, False, True], 0),
    # a trailing row without a usable start, after rows out of time order, was never read when streamed
    "text start last, rows out of order": (["normal", "start -2^63", "normal", "text start"],
                                           [False, False, False, False], 2),
}


@pytest.mark.parametrize("case", sorted(NAMED))
@pytest.mark.parametrize("quick", [True, False], ids=["quick", "full"])
def test_named_adversarial_tables(case, quick, tmp_path):
    kinds, frees, count = NAMED[case]
    memory, calls, bad = adversarial_rows(kinds, frees)
    assert len(bad) == count
    whole, streamed = both_paths(make_export(tmp_path / "rows.sqlite", memory=memory, calls=calls), quick, 2)
    assert_one_answer(whole, streamed, bad)
    if case == "device -1":
        assert whole["capture"]["processes"][0]["devices"] == [-1, 0]
        assert sorted(g["device"] for g in whole["groups"]) == [-1, 0]  # its own group, never merged into 0
    if case == "every row bad":
        assert whole["peaks"] == [] and whole["never_freed"] == []


@pytest.mark.parametrize("case", sorted(NAMED))
def test_named_tables_through_the_command_line_and_the_api(case, tmp_path, capsys):
    """The same tables through `nsysan analyze` (in this process) with and without
    `--max-memory 0` (streamed) and through `nsysan.analyze` (whole frame, and streamed with
    keep_events=False, max_memory=0): exit 0 and one document four ways."""
    import nsysan
    from test_documents import cli

    kinds, frees, _ = NAMED[case]
    memory, calls, bad = adversarial_rows(kinds, frees)
    path = make_export(tmp_path / "rows.sqlite", memory=memory, calls=calls)
    documents = []
    for more in ([], ["--max-memory", "0"]):
        code, out, err = cli(capsys, "analyze", str(path), "--format", "json", *more)
        assert code == 0 and "Traceback" not in err, err
        documents.append(without_source(json.loads(out)))
    documents.append(without_source(json.loads(render_json(nsysan.analyze(path)))))
    documents.append(without_source(json.loads(render_json(nsysan.analyze(path, keep_events=False, max_memory=0)))))
    assert all(document == documents[0] for document in documents[1:])
    assert_one_answer(documents[0], documents[1], bad)
