"""The streamed full analysis's trace ends (analyses/flow.py: from the calls' scan), against what
the fixtures say (that they are the whole frame's, in batches and on shuffled rows, is
test_bounded_memory's whole-document check; the bands and focus are one reducer on both paths,
explore.Explorable, and the ranges table another: test_engine.py)."""

from __future__ import annotations

import sqlite3

from conftest import FIXTURES
from test_bounded_memory import chunk_rowids, full_documents


def test_streamed_trace_end(monkeypatch):
    # known_mem_v22: nsys 2022.4 traced the CUDA 13 program only partly, its NVTX ranges go on
    # after the last CUDA call it recorded
    path = FIXTURES / "known_mem_v22.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    with sqlite3.connect(path) as conn:
        last_call = conn.execute('SELECT max("end") FROM CUPTI_ACTIVITY_KIND_RUNTIME').fetchone()[0]
    assert [(e["pid"], e["time_ns"]) for e in streamed["timeline"]["trace_ends"]] == \
        [(streamed["capture"]["processes"][0]["pid"], last_call)]
