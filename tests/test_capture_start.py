"""A capture that began after warm-up (torch_capture_range_v25: `--capture-range=cudaProfilerApi`
after three warm-up steps, then five NVTX steps): the blocks live when it began are said to be
so, never allocations made at 0 ms nor a module load's peak, and steps in which nothing is
allocated are steps."""

from __future__ import annotations

import json
import sqlite3

import pytest

from conftest import FIXTURES, analysis_of, cli
from test_bounded_memory import assert_streamed_full_is_whole, chunk_rowids, full_documents, quick_documents

MiB = 1 << 20
OUTSIDE_ALLOCATOR = 2 * (64 * MiB + 128 * 1024 + 1024)  # test_growth.py: cuBLAS's workspaces


def capture_start_truth() -> dict:
    lines = [json.loads(line) for line in (FIXTURES / "torch_capture_range_v25.truth.jsonl").read_text().splitlines()]
    started, = [t for t in lines if t.get("event") == "capture_start"]
    return started


def test_the_blocks_live_at_the_capture_start_are_said_first():
    analysis = analysis_of("torch_capture_range_v25")
    note, = [d for d in analysis.diagnostics if d.code == "live_at_capture_start"]
    assert note.severity == "warning"
    assert note.message.startswith(
        "3.5 GiB in 1,292 blocks were already live when the capture began (capture range from cuProfilerStart at "
        "16.27 ms): 76 device blocks (3.5 GiB), 1,215 module statics (865.4 KiB), 1 pinned (4 B); who allocated them")
    assert "live_at_capture_start" in [a.code for a in analysis.answers]
    # the device blocks are what the allocator had reserved then, plus the library workspaces
    device, = [g for g in analysis.groups if g.kind == "device"]
    assert device.peak_bytes == capture_start_truth()["reserved"] + OUTSIDE_ALLOCATOR


def test_the_peak_is_the_state_the_capture_found_not_a_module_load():
    analysis = analysis_of("torch_capture_range_v25")
    peak, = analysis.peaks
    assert (peak.api, peak.peak_time_ns) == ("(live at capture start)", 0)
    assert {a.api for a in peak.live_at_peak} == {"(live at capture start)"}
    assert not [d for d in analysis.diagnostics if "module load" in d.message]


def test_steps_without_allocations_are_steps():
    analysis = analysis_of("torch_capture_range_v25")
    series, = analysis.steps
    assert (series.found_by, [s.name for s in series.steps]) == ("nvtx", [f"step {i}" for i in range(5)])
    assert {(s.allocated_bytes, s.freed_bytes, s.delta_bytes) for s in series.steps} == {(0, 0, 0)}
    growth, = analysis.growth
    assert (growth.verdict, growth.message) == ("stable", "process 630 on GPU 0 is flat: nothing allocated or freed "
                                                          "in steps 0-4")
    assert not [d for d in analysis.diagnostics if d.code == "no_steps"]


@pytest.mark.parametrize("name", ["torch_capture_range_v25", "torch_startend_v25"])
def test_streamed_is_the_whole_frame(name, monkeypatch):
    path = FIXTURES / f"{name}.sqlite"
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_streamed_full_is_whole(whole, streamed)


def test_quick_never_calls_the_state_found_a_module_load(monkeypatch):
    path = FIXTURES / "torch_capture_range_v25.sqlite"
    whole, streamed = quick_documents(path, chunk_rowids(path), monkeypatch)
    assert streamed == whole
    document = json.loads(whole)
    assert [p["note"] for p in document["peaks"]] == [""]
    assert "live_at_capture_start" in [d["code"] for d in document["diagnostics"]]


def test_the_terminal_never_says_they_were_allocated_at_0_ms(capsys):
    code, out, _ = cli(capsys, "analyze", str(FIXTURES / "torch_capture_range_v25.sqlite"))
    assert code == 0
    never_freed = out[out.index("Never freed during the capture"):]
    rows = [line for line in never_freed.splitlines() if " MiB " in line or " KiB " in line][:10]
    assert len(rows) == 10 and all(line.rstrip().endswith("before capture") for line in rows), rows
    live = out[out.index("Live at the peak"):out.index("Never freed during the capture")]
    assert "0 ns" not in live and "unknown" in live
    assert "module load" not in out


def test_a_late_capture_without_nvtx_gets_its_steps_from_the_kernels(tmp_path, monkeypatch):
    # no memory call in the whole capture, and no NVTX: the kernels still repeat every step
    path = tmp_path / "capture_range_nonvtx.sqlite"
    with sqlite3.connect(FIXTURES / "torch_capture_range_v25.sqlite") as source, sqlite3.connect(path) as copy:
        source.backup(copy)
        copy.execute("DELETE FROM NVTX_EVENTS")
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_streamed_full_is_whole(whole, streamed)
    series, = whole["steps"]
    assert (series["found_by"], len(series["steps"])) == ("kernels", 5)
    growth, = whole["growth"]
    assert growth["message"].startswith("process 630 on GPU 0 is flat: nothing allocated or freed in steps 0-4; "
                                        "steps found from the kernel sequence: 5 iterations")
