"""The flow's one scan of the API table (stream_calls.MemoryCalls.scan): the code-load and graph
calls' rows read with the memory calls (`other_ids`) make the frame read_code_calls makes from
its own scan, and the memory calls the scan keeps are those of a scan for them alone."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import FIXTURES

from nsysan.events import stream_calls
from nsysan.events.read_code import code_call_ids, read_code_calls
from nsysan.events.stream_calls import MemoryCalls
from nsysan.sources.schema import open_readonly, probe


# torch_libloads_v25: 181 library loads among the calls; torch_graphs_v25: graph captures and launches
@pytest.mark.parametrize("name, chunk", [("torch_libloads_v25", 512), ("torch_graphs_v25", 256), ("ddp_leak_v25", 64)])
def test_the_code_calls_read_in_the_scan_of_the_memory_calls_are_those_read_alone(name, chunk, monkeypatch):
    monkeypatch.setattr(stream_calls, "CALL_CHUNK_ROWIDS", chunk)  # several chunks, each with some code calls
    conn = open_readonly(FIXTURES / f"{name}.sqlite")
    try:
        schema = probe(conn)
        alone, both = MemoryCalls(conn, schema), MemoryCalls(conn, schema)
        alone.scan()
        both.scan(None, code_call_ids(conn, schema))
        assert len(both.chunks) > 1 and alone.chunks == both.chunks
        for (_, real, chains), (_, real_with, chains_with) in zip(alone.read(), both.read()):
            assert all((real[c] == real_with[c]).all() for c in real) and all((chains[c] == chains_with[c]).all()
                                                                            for c in chains)
        made, read_alone = read_code_calls(conn, schema, both.other_rows), read_code_calls(conn, schema)
        alone.close()
        both.close()
    finally:
        conn.close()
    assert len(made) > 0 and len(made) == len(both.other_rows)
    pd.testing.assert_frame_equal(made, read_alone)
