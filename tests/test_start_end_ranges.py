"""NVTX start/end ranges (nvtxRangeStart/End, torch.cuda.nvtx.range_start/range_end) are ranges of
their process (events/read.py, NVTX_START_END): steps marked that way are steps, wherever they
start and end: in torch_startend_v25, and in torch_leak_v25 with its step ranges turned into
start/end ranges started on its autograd thread (the same steps as its push/pop ranges)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import nsysan
from conftest import FIXTURES, analysis_of

AUTOGRAD_THREAD = 1732  # torch_leak_v25's pt_autograd_0 (process 1644)
OUTSIDE_ALLOCATOR = 2 * ((64 << 20) + 128 * 1024 + 1024)  # test_growth.py: cuBLAS's workspaces


def with_start_end_steps(folder: Path) -> Path:
    out = folder / "torch_leak_startend.sqlite"
    with sqlite3.connect(FIXTURES / "torch_leak_v25.sqlite") as source, sqlite3.connect(out) as copy:
        source.backup(copy)
        copy.execute("UPDATE NVTX_EVENTS SET eventType = 60, globalTid = (globalTid >> 24 << 24) | ?, "
                     "endGlobalTid = globalTid WHERE text LIKE 'step %'", (AUTOGRAD_THREAD,))
        assert copy.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 60").fetchone()[0] == 6
    return out


def test_start_end_steps_across_threads_are_the_steps(tmp_path):
    analysis = nsysan.analyze(with_start_end_steps(tmp_path))
    marked, = analysis_of("torch_leak_v25").steps
    series, = analysis.steps
    assert (series.found_by, series.range_name) == ("nvtx", "step N")
    assert [(s.name, s.start_ns, s.end_ns, s.end_live_bytes) for s in series.steps] == \
        [(s.name, s.start_ns, s.end_ns, s.end_live_bytes) for s in marked.steps]
    growth, = analysis.growth
    before, = analysis_of("torch_leak_v25").growth
    assert (growth.verdict, growth.bytes_per_step, growth.holders) == ("growing", before.bytes_per_step, before.holders)
    # the autograd thread's allocations are the step's by time on the process: the backward pass keeps 1,544 MiB
    assert [(h.nvtx_range, h.bytes >> 20) for h in growth.holders][0] == ("backward", 1544)


def test_a_capture_of_start_end_steps_ended_on_other_threads():
    # gpt2_steps.py --nvtx startend: steps and phases marked with range_start/range_end only, the
    # ranges of steps 1, 3 and 5 ended on another thread
    with sqlite3.connect(FIXTURES / "torch_startend_v25.sqlite") as db:
        crossed = db.execute("SELECT text FROM NVTX_EVENTS WHERE eventType = 60 AND text LIKE 'step %' "
                             "AND endGlobalTid != globalTid ORDER BY start").fetchall()
    assert crossed == [("step 1",), ("step 3",), ("step 5",)]
    analysis = analysis_of("torch_startend_v25")
    series, = analysis.steps
    assert (series.found_by, [s.name for s in series.steps]) == ("nvtx", [f"step {i}" for i in range(6)])
    lines = [json.loads(line) for line in (FIXTURES / "torch_startend_v25.truth.jsonl").read_text().splitlines()]
    reserved = [t["reserved"] for t in lines if isinstance(t.get("step"), int) and t["step"] >= 0]
    assert [s.end_live_bytes for s in series.steps] == [r + OUTSIDE_ALLOCATOR for r in reserved]
    assert {p.path for p in analysis.phases} >= {"step N > forward", "step N > backward", "step N > optimizer"}
