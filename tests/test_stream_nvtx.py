"""NVTX ranges batch by batch (events.nvtx.RangeLookup): each event of the streamed flow, joined to
its API call's thread, gets the innermost range the whole events frame gives it."""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd
import pytest
from conftest import FIXTURES
from test_bounded_memory import chunk_rowids, shuffled_copy

from nsysan import analyze
from nsysan.events import nvtx, stream, stream_calls
from nsysan.events.nvtx import RangeLookup
from nsysan.events.read_nvtx import _nested, read_nvtx_ranges
from nsysan.events.stream import EventFlow
from nsysan.events.stream_calls import CallWindow, MemoryCalls
from nsysan.sources.schema import probe

NVTX_FIXTURES = ["known_bt_v25", "torch_leak_v25", "torch_ops_v25", "ddp_leak_v25", "torch_pybt_v25",
                 "jax_prealloc_v25"]


def streamed_ranges(path, chunk: int, monkeypatch) -> tuple[list[str], list[str]]:
    """Each event's innermost range and range path, found batch by batch in `chunk`-rowid batches."""
    monkeypatch.setattr(stream, "CHUNK_ROWIDS", chunk)
    monkeypatch.setattr(stream_calls, "CALL_CHUNK_ROWIDS", chunk)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        schema = probe(conn)
        calls = MemoryCalls(conn, schema)
        calls.scan()
        ranges, _ = read_nvtx_ranges(conn, schema)
        lookup = RangeLookup(ranges)  # sorted once, for every batch
        names = np.append(ranges["name"].to_numpy(dtype=object), "")
        paths = np.append(nvtx.range_paths(ranges), "") if len(ranges) else np.array([""], object)

        class Ranges:  # a flow that restarts (rows out of time order) makes a new one
            def __init__(self) -> None:
                self.found = [np.zeros(0, "int64")]

            def add(self, b) -> None:
                self.found.append(lookup.rows(b.pid, b.calls["tid"], b.ts))

        rows = np.concatenate(EventFlow(conn, schema, call_window=CallWindow(calls)).feed(Ranges).found)
    return names[rows].tolist(), paths[rows].tolist()  # row -1: the last one, ""


@pytest.mark.parametrize("name", NVTX_FIXTURES)
def test_ranges_found_batch_by_batch_are_the_whole_frame_ones(name, monkeypatch):
    path = FIXTURES / f"{name}.sqlite"
    events = analyze(path, keep_events=True).events
    ranges, paths = streamed_ranges(path, chunk_rowids(path), monkeypatch)
    assert ranges == events["nvtx_range"].astype(str).tolist()
    assert paths == events["nvtx_path"].astype(str).tolist()
    assert any(ranges)  # events really inside ranges


def test_ranges_batch_by_batch_with_rows_out_of_time_order(tmp_path, monkeypatch):
    path = shuffled_copy(FIXTURES / "torch_leak_v25.sqlite", tmp_path / "torch_leak_v25.sqlite", 11)
    events = analyze(path, keep_events=True).events
    ranges, _ = streamed_ranges(path, chunk_rowids(path), monkeypatch)
    assert ranges == events["nvtx_range"].astype(str).tolist()
    # torch_train.py pushes "setup", then per step "step N" around "forward", "backward" and
    # "optimizer"; PyTorch's reserve grows in every step (torch_leak_v25.truth.jsonl), so its new
    # blocks are allocated inside the step's innermost ranges
    assert {"setup", "forward", "backward", "optimizer"} <= set(ranges)


def test_points_after_every_range_start_find_the_range_still_open():
    # thread 1 opens "outer" at 0 ns until 1000; thread 2 has "inner" from 10 to 20 ns. Without
    # the points' times the lookup's axis spans the range starts alone (0-10 ns): a point at
    # 500 ns on thread 1 is looked up at 10 ns, where "outer" has started, and is still inside it.
    ranges = _nested(pd.DataFrame({"pid": np.int32([1, 1]), "tid": np.int32([1, 2]), "start_ns": [0, 10],
                                   "end_ns": [1000, 20], "name": np.array(["outer", "inner"], object)}))
    pid, tid, ts = np.array([1, 1, 1, 1]), np.array([1, 2, 2, 1]), np.array([500, 15, 30, 2000])
    rows = RangeLookup(ranges).rows(pid, tid, ts)
    names = np.append(ranges["name"].to_numpy(dtype=object), "")[rows].tolist()
    # at 30 ns thread 2's range is over: its process's main thread (tid 1 = pid) has "outer" open
    assert names == ["outer", "inner", "outer", ""]
    assert rows.tolist() == nvtx.innermost_range_rows(pid, tid, ts, ranges).tolist()


@pytest.mark.parametrize("times", [None, (0, 300)])
def test_innermost_range_at_every_start_and_end(times):
    # one thread: "step" 0-100 ns with "forward" from its start to 40 and "backward" from 40 to
    # 90 (back to back), then "late" from 95 to 300 (over the step's end: not nested). A range
    # holds its start, not its end. Without `times` the points after the last start (95 ns) are
    # past the lookup's axis.
    ranges = _nested(pd.DataFrame({"pid": np.int32([1] * 4), "tid": np.int32([1] * 4),
                                   "start_ns": [0, 0, 40, 95], "end_ns": [100, 40, 90, 300],
                                   "name": np.array(["step", "forward", "backward", "late"], object)}))
    ts = np.array([0, 39, 40, 89, 90, 94, 95, 100, 299, 300])
    rows = RangeLookup(ranges, times).rows(np.ones(len(ts), "int64"), np.ones(len(ts), "int64"), ts)
    names = np.append(ranges["name"].to_numpy(dtype=object), "")[rows].tolist()
    assert names == ["forward", "forward", "backward", "backward", "step", "step", "late", "late", "late", ""]
