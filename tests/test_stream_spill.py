"""The spills (events/spill.py): the second look's batches past a chunk's worth (stream._BatchFile),
and the API calls' chunks the scan read (stream_calls.MemoryCalls), go to files of Arrow IPC streams
and come back memory-mapped; each batch read back is the batch the first pass made."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import FIXTURES

from nsysan.events import spill, stream, stream_calls
from nsysan.events.stream import EventBatch, EventFlow
from nsysan.events.stream_calls import CallWindow, MemoryCalls
from nsysan.sources.schema import open_readonly, probe


class Kept:
    """Every batch of a pass, and its live allocations before it."""

    def __init__(self) -> None:
        self.batches: list[EventBatch] = []

    def add(self, batch: EventBatch) -> None:
        self.batches.append(batch)


def same(a, b) -> bool:
    return a.dtype == b.dtype and np.array_equal(a, b)


# known_mem_v25: an async pool (pool rows in batches); ddp_leak_v25: two ranks with API calls
@pytest.mark.parametrize("name", ["known_mem_v25", "ddp_leak_v25"])
def test_the_second_look_reads_back_the_first_passs_batches_from_the_spill_file(name, monkeypatch, tmp_path):
    monkeypatch.setattr(stream, "CHUNK_ROWIDS", 8)  # every batch past the first 8 events is written
    monkeypatch.setattr(stream_calls, "CALL_CHUNK_ROWIDS", 8)
    monkeypatch.setattr(spill.tempfile, "tempdir", str(tmp_path))
    conn = open_readonly(FIXTURES / f"{name}.sqlite")
    try:
        schema = probe(conn)
        calls = MemoryCalls(conn, schema)
        calls.scan()  # its chunks of calls, past 8, kept in a file of their own, which the window reads
        assert len(list(tmp_path.iterdir())) == 1
        flow = EventFlow(conn, schema, call_window=CallWindow(calls))
        first = flow.feed(Kept, keep=True).batches
        assert [p.suffix for p in tmp_path.iterdir()] == [".arrows", ".arrows"]  # the batches' too
        second = flow.replay(Kept).batches
        assert len(list(tmp_path.iterdir())) == 1  # the batches' file is gone once read
        calls.close()
    finally:
        conn.close()
    assert not list(tmp_path.iterdir())
    assert len(second) == len(first) > 3 and sum(len(b) for b in first) == flow.events
    for one, two in zip(first, second):
        for f in dataclasses.fields(EventBatch):
            if f.name == "shared":
                continue
            a, b = getattr(one, f.name), getattr(two, f.name)
            if isinstance(a, dict):  # closed, live_before, calls, pools: the same keys (none when empty)
                assert list(a) == list(b) and all(same(a[k], b[k]) for k in a), f.name
            else:
                assert same(a, b), f.name
    assert any(len(b.pools["ts_ns"]) for b in second) == (name == "known_mem_v25")
    assert all(len(b.calls["tid"]) == len(b) for b in second) and any((b.calls["tid"] >= 0).any() for b in second)
