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

import random
import shutil
import sqlite3
from pathlib import Path

import pytest
from conftest import FIXTURES

from nsysan import analyze, cli, pipeline, reader
from nsysan.analyses import arrays, calls
from nsysan.events import normalize, nvtx, read, stream
from nsysan.render.json import render_json

FIXTURE_NAMES = ["known_mem_v25", "known_bt_v25", "real_oom_v25",
                 "torch_leak_v25", "torch_pybt_v25", "torch_ops_v25", "ddp_leak_v25"]
SHUFFLED_TABLES = ["CUDA_GPU_MEMORY_USAGE_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME"]


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


def test_quick_streams_only_large_exports(monkeypatch):
    path = FIXTURES / "torch_leak_v25.sqlite"
    with sqlite3.connect(path) as conn:  # its memory table, counted here to know where the line falls
        rows = conn.execute("SELECT COUNT(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()[0]
    assert pipeline.STREAM_QUICK_FROM_ROWS == 20_000_000
    streamed = streaming_from(rows + 1, monkeypatch)
    pipeline.analyze_report(path, quick=True, keep_events=False)
    assert streamed == []  # one row short of the line: the whole frame, faster
    monkeypatch.setattr(pipeline, "STREAM_QUICK_FROM_ROWS", rows)
    pipeline.analyze_report(path, quick=True, keep_events=True)  # a notebook keeps its frame
    pipeline.analyze_report(path, quick=False, keep_events=False)  # the full analysis is not streamed
    assert streamed == []
    pipeline.analyze_report(path, quick=True, keep_events=False)
    assert streamed == [path]


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
    runs = []
    monkeypatch.setattr(stream, "memory_sorted_runs", lambda *args: runs.extend(read.memory_sorted_runs(*args)) or runs)
    whole, streamed = quick_documents(path, chunk_rowids(path), monkeypatch)
    assert len(runs) == piles  # merged as that many runs, a few chunks of each at a time
    assert streamed == whole


def test_streamed_quick_reads_the_table_again_when_the_batches_cannot_be_kept(monkeypatch):
    path = FIXTURES / "torch_leak_v25.sqlite"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    whole, kept = quick_documents(path, chunk_rowids(path), monkeypatch)
    monkeypatch.setattr(stream.pickle, "dump", disk_full)
    assert render_json(pipeline.analyze_report(path, quick=True, keep_events=False)) == kept == whole


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
