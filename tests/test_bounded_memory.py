"""Reading in chunks changes nothing: the same document as reading each table whole.

Large tables are read chunk by chunk (reader.read_converted, CHUNK_ROWIDS rowids at a time) and
each chunk is converted on its own; events are attributed to NVTX ranges POINT_CHUNK at a time,
API calls summed CALL_CHUNK at a time, sizes and deltas made SIZE_CHUNK at a time and distinct
(process, device) and (process, thread) pairs found PAIR_CHUNK at a time. The fixtures are smaller than one chunk, so here the chunks
are made a tenth of the memory table long: every fixture is then read in ten chunks or more, some
of them empty (rowids whose rows the WHERE leaves out), and must give the document it gives in one chunk. The
same holds for exports whose rows are not in time order (nsys 2025.6 writes them so): copies of
fixtures with the rows of their event tables shuffled.
"""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import FIXTURES, truth
from test_sites import python_lines_by_hand

from nsysan import analyze, cli
from nsysan.pipeline import stages as pipeline
from nsysan.sources import reader
from nsysan.analyses import calls, pools
from nsysan.events import arrays
from nsysan.events import normalize, nvtx, read, spill, stream, stream_calls
from nsysan.runs.gate import evaluate_limits
from nsysan.runs.limits import Limits
from nsysan.render.json import render_json

FIXTURE_NAMES = ["known_mem_v25", "known_bt_v25", "real_oom_v25",
                 "torch_leak_v25", "torch_pybt_v25", "torch_ops_v25", "ddp_leak_v25"]
SHUFFLED_TABLES = ["CUDA_GPU_MEMORY_USAGE_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME"]
MiB = 1 << 20


def document(path: Path, chunk: int, monkeypatch) -> str:
    """The analysis of `path` with every chunked step working `chunk` rows at a time."""
    monkeypatch.setattr(reader, "CHUNK_ROWIDS", chunk)
    monkeypatch.setattr(nvtx, "POINT_CHUNK", chunk)
    monkeypatch.setattr(calls, "CALL_CHUNK", chunk)
    monkeypatch.setattr(normalize, "SIZE_CHUNK", chunk)
    monkeypatch.setattr(arrays, "PAIR_CHUNK", chunk)
    return render_json(analyze(path))


def chunk_counts(path: Path, chunk_rowids: int) -> list[int]:
    """How many chunks each event table the export has is read in (rowid span / chunk size, rounded up)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        spans = [conn.execute(f"SELECT max(rowid) - min(rowid) + 1 FROM {t}").fetchone()[0]
                 for t in SHUFFLED_TABLES if t in tables]
    return [-(-span // chunk_rowids) for span in spans]


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_small_chunks_give_the_whole_table_document(name, monkeypatch):
    path = FIXTURES / f"{name}.sqlite"
    whole = document(path, 1 << 40, monkeypatch)
    chunk = chunk_rowids(path)
    assert chunk_counts(path, chunk) and min(chunk_counts(path, chunk)) > 3  # really read in several chunks
    assert document(path, chunk, monkeypatch) == whole


def chunk_rowids(path: Path) -> int:
    """A chunk size that reads the smaller event table in about ten chunks."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()[0]
    return max(2, rows // 10)


def shuffled_copy(source: Path, out: Path, seed: int) -> Path:
    """A copy of an export with the rows of its event tables in a random order (new rowids)."""
    shutil.copyfile(source, out)
    rng = random.Random(seed)
    with sqlite3.connect(out) as conn:
        for table in SHUFFLED_TABLES:
            rows = conn.execute(f"SELECT * FROM {table}").fetchall()
            rng.shuffle(rows)
            conn.execute(f"DELETE FROM {table}")
            conn.executemany(f"INSERT INTO {table} VALUES ({','.join('?' * len(rows[0]))})", rows)
        conn.commit()
    with sqlite3.connect(out) as conn:  # the shuffle did reorder the rowids
        times = [t for (t,) in conn.execute("SELECT start FROM CUDA_GPU_MEMORY_USAGE_EVENTS ORDER BY rowid")]
    assert times != sorted(times)
    return out


@pytest.mark.parametrize("name, seed", [("known_bt_v25", 1), ("torch_leak_v25", 2), ("real_oom_v25", 3)])
def test_shuffled_rows_chunked_and_whole_give_one_document(name, seed, tmp_path, monkeypatch):
    source = FIXTURES / f"{name}.sqlite"
    before = source.read_bytes()
    path = shuffled_copy(source, tmp_path / f"{name}.sqlite", seed)
    assert source.read_bytes() == before  # the fixture itself is never touched
    whole = document(path, 1 << 40, monkeypatch)
    assert document(path, chunk_rowids(path), monkeypatch) == whole


def test_keep_events_false_gives_the_same_document_without_the_frames(known_bt_v25):
    path = FIXTURES / "known_bt_v25.sqlite"
    lean = analyze(path, keep_events=False)
    assert lean.events is None and lean.calls is None and lean.nvtx_ranges is None
    assert render_json(lean) == render_json(known_bt_v25)
    # the session's analysis (default: a small export keeps its frames) has every column
    assert "correlation_id" in known_bt_v25.events and "correlation_id" in known_bt_v25.calls


def test_frames_are_kept_by_default_below_ten_million_events(monkeypatch):
    path = FIXTURES / "known_mem_v25.sqlite"
    assert pipeline.KEEP_EVENTS_BELOW == 10_000_000
    # known_mem_v25.truth.jsonl: 29 allocations, 23 of them freed, so 52 memory events
    assert len(analyze(path).events) == 52
    monkeypatch.setattr(pipeline, "KEEP_EVENTS_BELOW", 52)  # as if the export were large
    assert analyze(path).events is None
    assert len(analyze(path, keep_events=True).events) == 52


QUICK_FIXTURES = ["known_mem_v25", "known_bt_v25", "real_oom_v25", "torch_leak_v25",
                  "torch_oom_v25", "torch_expandable_v25", "ddp_leak_v25", "jax_prealloc_v25", "torch_ops_v25"]


def streaming_from(rows: int, monkeypatch) -> list[Path]:
    """Quick analyses stream from `rows` rows of the memory table on (as if the fixtures were
    large exports); the list fills with the path of each export streamed."""
    streamed: list[Path] = []
    real = pipeline._streamed
    monkeypatch.setattr(pipeline, "STREAM_QUICK_FROM_ROWS", rows)
    monkeypatch.setattr(pipeline, "_streamed", lambda report, *args: streamed.append(report) or real(report, *args))
    return streamed


def quick_documents(path: Path, chunk: int, monkeypatch) -> tuple[str, str]:
    """--quick of `path` from the whole events frame, and streamed in batches of `chunk` rowids
    (the command line's way, keep_events=False, of an export over STREAM_QUICK_FROM_ROWS rows)."""
    whole = render_json(pipeline.analyze_report(path, quick=True, keep_events=True))
    streamed = streaming_from(1, monkeypatch)
    monkeypatch.setattr(stream, "CHUNK_ROWIDS", chunk)
    document = render_json(pipeline.analyze_report(path, quick=True, keep_events=False))
    assert streamed == [path]
    return whole, document


def test_analyses_stream_only_large_exports(monkeypatch):
    path = FIXTURES / "torch_leak_v25.sqlite"
    with sqlite3.connect(path) as conn:  # its memory table, counted here to know where the line falls
        rows = conn.execute("SELECT COUNT(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()[0]
    assert pipeline.STREAM_QUICK_FROM_ROWS == 20_000_000
    streamed = streaming_from(rows + 1, monkeypatch)
    pipeline.analyze_report(path, quick=True, keep_events=False)
    assert streamed == []  # one row short of the line: the whole frame, faster
    monkeypatch.setattr(pipeline, "STREAM_QUICK_FROM_ROWS", rows)
    pipeline.analyze_report(path, quick=True, keep_events=True)  # a notebook keeps its frame
    pipeline.analyze_report(path, quick=False, keep_events=None)  # also a notebook's full analysis
    assert streamed == []
    pipeline.analyze_report(path, quick=True, keep_events=False)
    assert streamed == [path]
    assert pipeline.analyze_report(path, quick=False, keep_events=False).scope == "full"  # the command line's
    assert streamed == [path, path]


@pytest.mark.parametrize("name", QUICK_FIXTURES)
def test_streamed_quick_gives_the_whole_frame_document(name, monkeypatch):
    path = FIXTURES / f"{name}.sqlite"
    chunk = chunk_rowids(path)
    assert chunk_counts(path, chunk)[0] > 3  # the memory table really streamed in several batches
    whole, streamed = quick_documents(path, chunk, monkeypatch)
    assert streamed == whole


@pytest.mark.parametrize("name, seed", [("known_bt_v25", 4), ("torch_leak_v25", 5), ("ddp_leak_v25", 6)])
def test_streamed_quick_merges_rows_out_of_time_order(name, seed, tmp_path, monkeypatch):
    path = shuffled_copy(FIXTURES / f"{name}.sqlite", tmp_path / f"{name}.sqlite", seed)
    whole, streamed = quick_documents(path, chunk_rowids(path), monkeypatch)
    assert streamed == whole


def test_streamed_quick_is_what_the_command_line_writes(tmp_path, monkeypatch):
    # torch_leak_v25.truth.jsonl: the leak of 64 MiB per step shows in the quick document too
    path = FIXTURES / "torch_leak_v25.sqlite"
    whole, _ = quick_documents(path, chunk_rowids(path), monkeypatch)
    streamed = streaming_from(1, monkeypatch)  # in this process, as if the export were large
    out = tmp_path / "quick.json"
    try:
        cli.main(["analyze", str(path), "--quick", "--json", str(out), "--no-progress"])
    except SystemExit as ended:
        assert ended.code in (0, None)
    assert streamed == [path]
    assert out.read_text() == whole


def dealt_copy(source: Path, out: Path, piles: int) -> Path:
    """A copy of an export whose memory rows are dealt, in time order, onto `piles` piles written
    one after the other (as an export written rank by rank): `piles` runs in time order."""
    shutil.copyfile(source, out)
    table = SHUFFLED_TABLES[0]
    with sqlite3.connect(out) as conn:
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall()
        dealt = [row for pile in range(piles) for row in rows[pile::piles]]
        conn.execute(f"DELETE FROM {table}")
        conn.executemany(f"INSERT INTO {table} VALUES ({','.join('?' * len(rows[0]))})", dealt)
        conn.commit()
    return out


@pytest.mark.parametrize("name, piles", [("torch_leak_v25", 3), ("ddp_leak_v25", 2), ("real_oom_v25", 5)])
def test_streamed_quick_merges_runs_in_time_order(name, piles, tmp_path, monkeypatch):
    path = dealt_copy(FIXTURES / f"{name}.sqlite", tmp_path / f"{name}.sqlite", piles)
    runs, emitted = [], []
    monkeypatch.setattr(stream, "memory_sorted_runs", lambda *args: runs.extend(read.memory_sorted_runs(*args)) or runs)
    emit = stream.EventFlow._emit
    monkeypatch.setattr(stream.EventFlow, "_emit", lambda self, rows: emitted.append(len(rows["key"])) or emit(self, rows))
    whole, streamed = quick_documents(path, chunk_rowids(path), monkeypatch)
    assert len(runs) == piles  # merged as that many runs, a few chunks of each at a time
    assert streamed == whole
    # a batch holds a chunk's worth of rows or more (the last one the rest), however the runs are reached
    assert len(emitted) > 2 and min(emitted[:-1]) >= chunk_rowids(path)


def test_streamed_quick_reads_the_table_again_when_the_batches_cannot_be_kept(monkeypatch):
    path = FIXTURES / "torch_leak_v25.sqlite"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    whole, kept = quick_documents(path, chunk_rowids(path), monkeypatch)
    monkeypatch.setattr(spill, "_write_columns", disk_full)
    assert render_json(pipeline.analyze_report(path, quick=True, keep_events=False)) == kept == whole


@pytest.mark.parametrize("copy", ["as is", "shuffled", "dealt"])
def test_streamed_quick_downsamples_the_pools_as_the_whole_frame(copy, tmp_path, monkeypatch):
    # known_mem_v25's default pool: 8 pool rows (4 cudaMallocAsync blocks of 8, 16, 24, 32 MiB, each
    # freed before the next; reserve 32 MiB for the first two, 64 MiB from the 24 MiB one on) and
    # 2 pool events (created with 32 MiB before them, trimmed to 0 after): 10 points in time order.
    path = FIXTURES / "known_mem_v25.sqlite"
    if copy == "shuffled":
        path = shuffled_copy(path, tmp_path / "shuffled.sqlite", 7)
    elif copy == "dealt":
        path = dealt_copy(path, tmp_path / "dealt.sqlite", 3)
    monkeypatch.setattr(pools, "MAX_POINTS", 6)  # three buckets: points 0-3, 4-6 and 7-9 (3 * i // 10)
    whole, streamed = quick_documents(path, chunk_rowids(path), monkeypatch)
    assert streamed == whole
    (pool,) = json.loads(streamed)["reserved"]["pools"]
    # per bucket the first highest reserve and the last point: 0 (created) and 3 (16 MiB out);
    # 5 (24 MiB out, the reserve now 64 MiB) and 6 (back); 7 (32 MiB out) and 9 (the trim)
    assert [b // MiB for b in pool["reserved_bytes"]] == [32, 32, 64, 64, 64, 0]
    assert [b // MiB for b in pool["used_bytes"]] == [0, 16, 24, 0, 32, 0]
    assert pool["peak_reserved_bytes"] == 64 * MiB and pool["peak_used_bytes"] == 32 * MiB


def test_streamed_quick_keeps_bad_pool_rows_as_the_whole_frame(tmp_path, monkeypatch):
    # a pool row with an unknown operation is left out of the events but still counts in its pool
    # (as a free: not an allocation); one at a time beyond 2^61 ns has no place in time, left out of both
    path = tmp_path / "bad_pool_rows.sqlite"
    shutil.copyfile(FIXTURES / "known_mem_v25.sqlite", path)
    table = SHUFFLED_TABLES[0]
    with sqlite3.connect(path) as conn:
        rows = [r for (r,) in conn.execute(f"SELECT rowid FROM {table} WHERE localMemoryPoolAddress != 0 "
                                           "ORDER BY start")]
        conn.execute(f"UPDATE {table} SET memoryOperationType = 7 WHERE rowid = ?", (rows[1],))  # the 8 MiB free
        conn.execute(f"UPDATE {table} SET start = ? WHERE rowid = ?", (2**62, rows[7]))  # the 32 MiB free
        conn.commit()
    whole, streamed = quick_documents(path, chunk_rowids(path), monkeypatch)
    assert streamed == whole
    (pool,) = json.loads(streamed)["reserved"]["pools"]
    # 9 points: created, 8 MiB out and back (the unknown operation counts as a free), 16, 24 and
    # 32 MiB handed out, the last never back (its free left out), then the trim
    assert [b // MiB for b in pool["used_bytes"]] == [0, 8, 0, 16, 0, 24, 0, 32, 32]
    # a row a batch: the pool row left out of the events makes a batch of no events
    assert quick_documents(path, 1, monkeypatch)[1] == whole



# --- the full analysis streamed (analyses/flow.py) ---------------------------------------------

# torch_oom_v25 is the capture whose allocator gave up without a failing call, and whose growth
# runs into that cap; jax_prealloc_v25 grows inside XLA's preallocated block
FULL_FIXTURES = ["known_mem_v22", "known_bt_v25", "real_oom_v25", "torch_leak_v25", "torch_pybt_v25",
                 "torch_ops_v25", "torch_expandable_v25", "ddp_leak_v25", "jax_prealloc_v25", "torch_oom_v25",
                 # issue 26: an OOM inside an unclosed range after an empty_cache(), PyTorch's
                 # cudaMallocAsync backend (its pool's peak and reserve)
                 "torch_fraction_oom_v25", "torch_async_v25",
                 # issue 30: what the bytes are, exact (no caching allocator) and segment-level
                 "torch_bytes_exact_v25", "torch_bytes_cached_v25"]
# What the streamed full analysis computes as the whole frame does: these parts of the document.
STREAMED_FULL = ("capture", "groups", "sites", "api_calls", "failed_calls", "never_freed", "never_freed_total",
                 "reserved.pools", "reserved.preallocations", "timeline.allocations", "timeline.allocations_total", "never_freed_groups",
                 "timeline.series", "timeline.start_ns", "timeline.end_ns", "peaks", "oom", "reserved", "caps", "spikes",
                 "ranges", "range_families", "timeline.bands", "timeline.spans", "timeline.operator_spans", "timeline.trace_ends", "timeline.focus_start_ns",
                 "timeline.focus_end_ns", "steps", "growth", "phases", "byte_classes")


def full_documents(path: Path, chunk: int, monkeypatch) -> tuple[dict, dict]:
    """The full analysis of `path` from the whole frames, and streamed with batches of `chunk`
    memory rowids and the API table read `chunk` rowids at a time (as the command line analyzes
    an export over STREAM_QUICK_FROM_ROWS rows)."""
    whole = json.loads(render_json(pipeline.analyze_report(path, keep_events=True)))
    streamed = streaming_from(1, monkeypatch)
    monkeypatch.setattr(stream, "CHUNK_ROWIDS", chunk)
    monkeypatch.setattr(stream_calls, "CALL_CHUNK_ROWIDS", chunk)
    document = json.loads(render_json(pipeline.analyze_report(path, keep_events=False)))
    assert streamed == [path]
    return whole, document


def part(document: dict, name: str):
    """A part of a document: a section, or one field of each entry of a section ("peaks.peak_bytes")."""
    section, _, field = name.partition(".")
    value = document[section]
    if not field:
        return value
    return [entry[field] for entry in value] if isinstance(value, list) else value[field]


def used_stacks(document: dict) -> list:
    """The stacks the sites and the never-freed and largest allocations refer to."""
    ids = {s["site"]["stack_id"] for s in document["sites"]} | \
        {a["stack_id"] for a in document["never_freed"] + document["timeline"]["allocations"]}
    return [s for s in document["stacks"] if s["id"] in ids]


def assert_streamed_full_is_whole(whole: dict, streamed: dict) -> None:
    assert streamed["scope"] == whole["scope"] == "full"
    for name in STREAMED_FULL:
        assert part(streamed, name) == part(whole, name), name
    assert used_stacks(streamed) == used_stacks(whole)
    # every section is streamed: nothing is left empty, and the whole document is the whole frame's
    assert not [d for d in streamed["diagnostics"] if d["code"] == "not_streamed"]
    assert streamed == whole


@pytest.mark.parametrize("name", FULL_FIXTURES)
def test_streamed_full_sections_are_the_whole_frame_ones(name, monkeypatch):
    path = FIXTURES / f"{name}.sqlite"
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_streamed_full_is_whole(whole, streamed)
    # so every section is checked here, the verdicts', steps' and ranges' included (their own
    # tests look at shuffled rows and at what the fixtures' truths say)
    assert streamed["ranges"] and streamed["timeline"]["bands"]  # every one of these captures has NVTX ranges


def test_streamed_full_sites_from_native_and_python_stacks(monkeypatch):
    # known_bt_v25.truth.jsonl: alloc_weights allocates 256 MiB (freed) and 128 MiB (never freed),
    # named from its native stack
    path = FIXTURES / "known_bt_v25.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    weights = [s for s in streamed["sites"] if s["site"]["function"] == "alloc_weights"]
    assert [(s["allocated_bytes"], s["never_freed_bytes"], s["site"]["source"]) for s in weights] == \
        [(384 * 2**20, 128 * 2**20, "native")]
    # torch_pybt_v25: the three largest Python lines, read from the marks' payloads by hand
    path = FIXTURES / "torch_pybt_v25.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    python = [s for s in streamed["sites"] if s["site"]["source"] == "python"]
    by_hand = python_lines_by_hand(path)
    assert [(s["site"]["function"], s["site"]["line"], s["allocations"], s["allocated_bytes"]) for s in python[:3]] == [
        (function, line, len(by_hand[(function, line)]), sum(by_hand[(function, line)]))
        for function, line in (("main", 43), ("main", 44), ("build", 19))]


@pytest.mark.parametrize("name, seed", [
    ("known_bt_v25", 7), ("torch_pybt_v25", 8), ("ddp_leak_v25", 9), ("torch_ops_v25", 11), ("torch_leak_v25", 12),
    ("ddp_leak_v25", 13), ("torch_leak_v25", 11), ("ddp_leak_v25", 12), ("known_bt_v25", 13), ("real_oom_v25", 3),
    ("torch_oom_v25", 4), ("torch_expandable_v25", 5), ("jax_prealloc_v25", 6), ("ddp_leak_v25", 7)])
def test_streamed_full_joins_calls_out_of_time_order(name, seed, tmp_path, monkeypatch):
    # both event tables shuffled: every chunk of calls starts early, the window holds them all;
    # the memory rows out of order too, so the runs merge, the ranges' and steps' windows and the
    # verdicts' running state all see events arrive as the merge gives them
    path = shuffled_copy(FIXTURES / f"{name}.sqlite", tmp_path / f"{name}.sqlite", seed)
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_streamed_full_is_whole(whole, streamed)


def dealt_calls_copy(source: Path, out: Path, piles: int) -> Path:
    """A copy whose memory rows and API rows are each dealt onto `piles` runs in time order."""
    dealt_copy(source, out.with_suffix(".tmp"), piles)
    shutil.move(out.with_suffix(".tmp"), out)
    with sqlite3.connect(out) as conn:
        rows = conn.execute(f"SELECT * FROM {SHUFFLED_TABLES[1]} ORDER BY rowid").fetchall()
        conn.execute(f"DELETE FROM {SHUFFLED_TABLES[1]}")
        conn.executemany(f"INSERT INTO {SHUFFLED_TABLES[1]} VALUES ({','.join('?' * len(rows[0]))})",
                         [row for pile in range(piles) for row in rows[pile::piles]])
        conn.commit()
    return out


def windows_made(monkeypatch) -> list:
    """The list that fills with each CallWindow made (to look at what it held)."""
    windows: list = []
    real = stream_calls.CallWindow.__init__
    monkeypatch.setattr(stream_calls.CallWindow, "__init__", lambda self, calls: windows.append(self) or real(self, calls))
    return windows


def test_streamed_full_window_holds_a_few_chunks_of_calls_in_runs(tmp_path, monkeypatch):
    path = dealt_calls_copy(FIXTURES / "ddp_leak_v25.sqlite", tmp_path / "ddp.sqlite", 3)
    windows = windows_made(monkeypatch)
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_streamed_full_is_whole(whole, streamed)
    window = windows[-1]
    with sqlite3.connect(path) as conn:
        calls = conn.execute(f"SELECT count(*) FROM {SHUFFLED_TABLES[1]}").fetchone()[0]
    chunk = chunk_rowids(path)
    # three runs: at most a few chunks of each are held at a time, far from all the calls
    assert window.exact and not window.keep_all
    assert window.most_held <= 3 * 3 * chunk < calls


@pytest.mark.parametrize("earlier_ns", [0, 3_000_000_000])
def test_streamed_full_holds_every_call_when_events_fall_outside_their_calls(tmp_path, monkeypatch, earlier_ns):
    # Calls shortened to their first nanosecond: each event now lies after its call ended. The
    # window holds a call from the batch that reaches its start to the one after its end: it
    # still finds the calls of events in the batch of their start. Moved 3 s earlier as well
    # (the capture's events span 5 s), the calls are dropped batches before their events: the
    # check at the end finds it and the flow runs again holding every call. The document is
    # the whole-frame one either way.
    path = tmp_path / "torch_leak_v25.sqlite"
    shutil.copyfile(FIXTURES / "torch_leak_v25.sqlite", path)
    with sqlite3.connect(path) as conn:
        conn.execute(f'UPDATE {SHUFFLED_TABLES[1]} SET "end" = start - ?, start = start - ?', (earlier_ns, earlier_ns))
        conn.commit()
    windows = windows_made(monkeypatch)
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert windows[-1].keep_all == (earlier_ns > 0) and windows[-1].exact
    assert_streamed_full_is_whole(whole, streamed)


def test_a_successful_allocation_call_without_its_event_is_counted_on_both_paths(tmp_path, monkeypatch):
    # known_mem_v25's cuMemAlloc of 5 MiB (truth: other_kinds, never freed) without its memory
    # row: the call table's successful allocations, less those the events joined, on both paths
    path = tmp_path / "known_mem_v25.sqlite"
    shutil.copyfile(FIXTURES / "known_mem_v25.sqlite", path)
    (leaked,) = [r for r in truth("known_mem_v25") if r.get("truth") == "cuMemAlloc"]
    with sqlite3.connect(path) as conn:
        assert conn.execute("DELETE FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memoryOperationType = 0 AND bytes = ?",
                            (leaked["bytes"],)).rowcount == 1
        conn.commit()
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_streamed_full_is_whole(whole, streamed)
    (note,) = [d["message"] for d in streamed["diagnostics"] if d["code"] == "allocations_without_events"]
    assert note.startswith("1 successful allocation calls have no memory event")
    assert "allocations_without_events" not in {d.code for d in analyze(FIXTURES / "known_mem_v25.sqlite").diagnostics}


def test_check_judges_the_streamed_full_analysis_as_the_whole_frame(monkeypatch, capsys):
    path = FIXTURES / "torch_leak_v25.sqlite"
    whole = pipeline.analyze_report(path, keep_events=True)
    streaming_from(1, monkeypatch)
    monkeypatch.setattr(stream, "CHUNK_ROWIDS", chunk_rowids(path))
    streamed = pipeline.analyze_report(path, keep_events=False)
    # limits are judged on the same numbers as from the whole frame, growth per step included
    # (torch_leak_v25: 735 MiB a step)
    assert any(d.code == "memory_growth" for d in whole.diagnostics)
    for limits in (Limits.parse(max_peak="1GiB"), Limits.parse(max_never_freed="1GiB", per="process"),
                   Limits.parse(max_growth_per_step="1MiB"), Limits.parse(no_warnings="memory_growth")):
        assert evaluate_limits(streamed, None, limits).outcomes == evaluate_limits(whole, None, limits).outcomes
    # every section is streamed: --no-warnings all is judged on the whole frame's warnings
    assert evaluate_limits(streamed, None, Limits.parse(no_warnings="all")).outcomes == \
        evaluate_limits(whole, None, Limits.parse(no_warnings="all")).outcomes
    with pytest.raises(SystemExit) as ended:  # the command line: the limit broken, exit 1
        cli.main(["check", str(path), "--max-growth-per-step", "1MiB"])
    assert ended.value.code == 1
    assert "did not compute" not in capsys.readouterr().err


def test_streamed_quick_leaves_out_rows_written_twice(tmp_path, monkeypatch):
    # an export written twice into one file holds every memory row twice: both ways keep one of each
    path = tmp_path / "known_mem_v25.sqlite"
    shutil.copyfile(FIXTURES / "known_mem_v25.sqlite", path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"INSERT INTO {SHUFFLED_TABLES[0]} SELECT * FROM {SHUFFLED_TABLES[0]} ORDER BY rowid")
        conn.commit()
    whole, streamed = quick_documents(path, chunk_rowids(path), monkeypatch)
    assert streamed == whole
    # known_mem_v25.truth.jsonl: 29 allocations and 23 frees, 52 rows left out as copies
    assert "52 memory events were exact copies" in whole
