"""The spills (events/spill.py): the second look's batches past a chunk's worth (stream._BatchFile),
and the API calls' chunks the scan read (stream_calls.MemoryCalls), go to files of Arrow IPC streams
and come back memory-mapped; each batch read back is the batch the first pass made."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import FIXTURES

from nsysan.events import spill, stream, stream_calls
from nsysan.events.stream import EventFlow
from nsysan.events.batch import EventBatch
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


# known_mem_v25: an async pool (pool rows in batches), 52 events; ddp_leak_v25: two ranks with API calls
@pytest.mark.parametrize("name, chunk, alternate", [("known_mem_v25", 8, False), ("ddp_leak_v25", 64, False),
                                                     ("ddp_leak_v25", 64, True)])
def test_the_second_look_reads_back_the_first_passs_batches_from_the_spill_file(name, chunk, alternate, monkeypatch,
                                                                                tmp_path):
    monkeypatch.setattr(stream, "CHUNK_ROWIDS", chunk)  # every batch past the first `chunk` events is written
    if alternate:  # the live allocations before every other batch kept with it, the others' made again
        turns = iter(range(10**6))
        monkeypatch.setattr(stream, "_keeps_live", lambda batch: next(turns) % 3 == 1)
    monkeypatch.setattr(stream_calls, "CALL_CHUNK_ROWIDS", chunk)
    monkeypatch.setattr(spill.tempfile, "tempdir", str(tmp_path))
    conn = open_readonly(FIXTURES / f"{name}.sqlite")
    try:
        schema = probe(conn)
        calls = MemoryCalls(conn, schema)
        calls.scan()  # its chunks of calls, past a chunk's worth, kept in a file of their own, which the window reads
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


def test_a_full_disk_reads_the_tables_again_and_the_document_is_the_same(monkeypatch):
    """With no file writable, the streamed full analysis reads the API table again for the window
    and the memory table again for the second look: the same document as the whole frame's."""
    from nsysan.pipeline import stages as pipeline
    from nsysan.render.json import render_json

    path = FIXTURES / "ddp_leak_v25.sqlite"
    whole = render_json(pipeline.analyze_report(path, keep_events=False))
    monkeypatch.setattr(stream, "CHUNK_ROWIDS", 64)
    monkeypatch.setattr(stream_calls, "CALL_CHUNK_ROWIDS", 64)
    tried = []

    def disk_full(*args, **kwargs):
        tried.append(args)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill, "_write_columns", disk_full)
    read = []  # what the scan kept, as each later read of the calls finds it (the scan reads the table itself)
    for name in ("read", "read_ahead"):
        real_read = getattr(stream_calls.MemoryCalls, name)
        monkeypatch.setattr(stream_calls.MemoryCalls, name,
                            lambda self, *a, real_read=real_read: read.append(self._kept) or real_read(self, *a))
    assert render_json(pipeline.analyze_report(path, keep_events=False, max_memory=0)) == whole
    # both spills tried, and failed: the calls' (a chunk's calls) and the batches' (a batch's own arrays)
    assert {"return_value" in columns or "seq" in columns for _, columns in tried} == {True} and \
        any("return_value" in columns for _, columns in tried) and any("seq" in columns for _, columns in tried)
    assert read and all(kept is None for kept in read)  # every read of the calls from the table


def test_batches_made_ahead_come_in_order_raise_on_the_callers_thread_and_stop_with_it():
    """stream._made_ahead: the first pass's batches are made on a thread of their own, at most one
    ahead of the analyses; what the maker raises reaches the caller after the batches before it,
    and a caller that stops early stops the maker (its generator closed, its thread gone)."""
    import threading

    made, closed = [], []

    def batches(n: int, fail: bool):
        try:
            for i in range(n):
                made.append(i)
                yield i
            if fail:
                raise ValueError("a damaged row")
        finally:
            closed.append(n)

    got = []
    with pytest.raises(ValueError, match="a damaged row"):
        for batch in stream._made_ahead(batches(10, True)):
            got.append(batch)
    assert got == list(range(10)) and closed == [10]
    made.clear()
    early = stream._made_ahead(batches(1000, False))
    assert next(early) == 0
    early.close()
    assert closed == [10, 1000] and len(made) <= 3  # one taken, one handed over, one being made
    assert not [t for t in threading.enumerate() if t.name == "nsysan-batches"]


def test_integer_columns_come_back_from_the_spill_exactly_whatever_they_span(tmp_path, monkeypatch):
    """A column is written as its distances from its lowest value in the fewest bytes that hold
    them (spill._narrowed): negative values, values near the ends of their type and spans just
    past a narrow type's come back the same, in their own dtype."""
    monkeypatch.setattr(spill.tempfile, "tempdir", str(tmp_path))
    low, high = np.iinfo("int64").min, np.iinfo("int64").max
    columns = {
        "minus_one_up": np.array([-1, 5, -1, 70_000], "int64"),  # a span past uint16's: 4 bytes
        "near_the_top": np.array([high, high - 255, high - 3, high], "int64"),  # 1 byte
        "near_the_bottom": np.array([low, low + 65_536, low, low + 1], "int64"),  # past uint16's
        "everything": np.array([low, high, 0, -7], "int64"),  # no narrow type: as it is
        "addresses": np.array([2**64 - 1, 2**64 - 2**32, 2**63, 2**64 - 1], "uint64"),  # past uint32's
        "high_addresses": np.array([2**64 - 1, 2**64 - 2**32, 2**64 - 2, 2**64 - 1], "uint64"),  # uint32's
        "threads": np.array([-1, 2**31 - 1, -1, 0], "int32"),
        "devices": np.array([-1, 3, 0, 254], "int16"),  # 1 byte: 256 values
        "flags": np.array([True, False, True, True]),
        "codes": np.array([-128, 127, 0, 1], "int8"),
    }
    kept = spill.ColumnSpill()
    kept.add({"": columns, "none": {"empty": np.zeros(0, "int64")}})
    stored = kept.written[0].result()[""][2]
    assert {name: low is not None for name, (_, low) in stored.items()} == {
        "minus_one_up": True, "near_the_top": True, "near_the_bottom": True, "everything": False,
        "addresses": False, "high_addresses": True, "threads": False, "devices": True, "flags": False, "codes": False}
    back = kept.read(0)
    kept.close()
    assert list(back[""]) == list(columns) and all(same(back[""][c], v) for c, v in columns.items())
    assert same(back["none"]["empty"], np.zeros(0, "int64"))


def test_the_second_passs_stages_each_see_every_batch_in_order_before_the_consumer(monkeypatch, tmp_path):
    """EventFlow.replay's `ahead` stages (the labels, then the reducers that may go ahead): each
    runs on every batch in order on a thread of its own, and a batch reaches the consumer only
    once every stage is done with it."""
    import threading

    monkeypatch.setattr(stream, "CHUNK_ROWIDS", 64)
    monkeypatch.setattr(spill.tempfile, "tempdir", str(tmp_path))
    seen: dict = {"label": [], "ahead": []}
    threads: dict = {"label": set(), "ahead": set()}

    def stage(name):
        def work(batch):
            seen[name].append(int(batch.seq[0]) if len(batch) else -1)
            threads[name].add(threading.get_ident())
            batch.shared[name] = True
        return work

    class Consumer:
        def __init__(self) -> None:
            self.batches: list = []

        def add(self, batch) -> None:
            assert batch.shared.get("label") and batch.shared.get("ahead")
            self.batches.append(int(batch.seq[0]) if len(batch) else -1)

    conn = open_readonly(FIXTURES / "ddp_leak_v25.sqlite")
    try:
        flow = EventFlow(conn, probe(conn))
        first = flow.feed(Kept, keep=True).batches
        second = flow.replay(Consumer, ahead=(stage("label"), stage("ahead")))
    finally:
        conn.close()
    order = [int(b.seq[0]) if len(b) else -1 for b in first]
    assert len(order) > 3 and seen["label"] == seen["ahead"] == second.batches == order
    assert len(threads["label"]) == len(threads["ahead"]) == 1 and threads["label"] != threads["ahead"]
    assert threading.get_ident() not in threads["label"] | threads["ahead"]
