"""NVTX start/end ranges (nvtxRangeStart/End, torch.cuda.nvtx.range_start/range_end) are ranges of
their process (events/read.py, NVTX_START_END): steps marked that way are steps, wherever they
start and end. Until a capture of such a script is among the fixtures, torch_leak_v25's own step
ranges are turned into start/end ranges started on its autograd thread."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import nsysan
from conftest import FIXTURES, analysis_of

AUTOGRAD_THREAD = 1732  # torch_leak_v25's pt_autograd_0 (process 1644)


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
