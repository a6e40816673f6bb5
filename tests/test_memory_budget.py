"""The memory budget: an analysis whose whole frame would not fit it streams its events instead,
with the same document (nsysan/runtime/memory_budget.py, pipeline.analyze_report's `max_memory`,
`--max-memory` of analyze and batch)."""

from __future__ import annotations

import csv
import json
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

import nsysan
from nsysan.pipeline import stages as pipeline
from nsysan.runtime import memory_budget
from nsysan.errors import NsysanError
from nsysan.render.json import render_json

LEAK = FIXTURES / "torch_leak_v25.sqlite"
GiB = 1 << 30


def memory_rows(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT COUNT(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS").fetchone()[0]


def recording_streams(monkeypatch) -> list[Path]:
    """The list fills with each report whose events pipeline streams."""
    streamed: list[Path] = []
    real = pipeline._streamed
    monkeypatch.setattr(pipeline, "_streamed", lambda report, *args: streamed.append(report) or real(report, *args))
    return streamed


def nsysan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("quick", [False, True])
def test_a_budget_under_the_whole_frame_streams_the_same_document(quick, monkeypatch):
    rows = memory_rows(LEAK)
    assert rows == 1378
    need = memory_budget.whole_frame_bytes(rows, quick)
    assert need == rows * (180 if quick else 240)
    streamed = recording_streams(monkeypatch)
    whole = render_json(pipeline.analyze_report(LEAK, quick=quick, keep_events=False, max_memory=need))
    assert streamed == []  # it fits, to the byte
    within = render_json(pipeline.analyze_report(LEAK, quick=quick, keep_events=False, max_memory=need - 1))
    assert streamed == [LEAK]
    assert within == whole
    assert json.loads(within)["peak"]["peak_bytes"] == 5_682_335_061


def test_a_notebook_keeping_its_frames_is_never_streamed(monkeypatch):
    streamed = recording_streams(monkeypatch)
    analysis = pipeline.analyze_report(LEAK, keep_events=True, max_memory=1)
    assert streamed == [] and analysis.events is not None and len(analysis.events) == 1378


def test_a_notebook_default_streams_only_exports_whose_frames_it_would_not_keep(monkeypatch):
    """keep_events=None keeps the frames below KEEP_EVENTS_BELOW memory events (so builds them,
    whatever the budget); from there on it keeps none, and streams as the command line does."""
    streamed = recording_streams(monkeypatch)
    assert pipeline.analyze_report(LEAK, max_memory=1).events is not None
    assert streamed == []
    monkeypatch.setattr(pipeline, "KEEP_EVENTS_BELOW", 1378)  # as if torch_leak_v25 were that large
    analysis = pipeline.analyze_report(LEAK, max_memory=1)
    assert streamed == [LEAK] and analysis.events is None and analysis.peak.peak_bytes == 5_682_335_061
    assert pipeline.analyze_report(LEAK).events is None  # no frames kept, and the default budget fits it
    assert streamed == [LEAK]


def test_the_default_budget_is_half_of_what_the_process_may_use(monkeypatch):
    """With no budget given, a machine (or container) with less room than the whole frame needs
    streams it: here as if 400 kB were available (the frame takes 330,720 bytes, half of 400 kB
    is less)."""
    monkeypatch.setattr(memory_budget, "_available", lambda: 400_000)
    monkeypatch.setattr(memory_budget, "_cgroup_room", lambda: None)
    monkeypatch.setattr(memory_budget, "_address_space_limit", lambda: None)
    assert memory_budget.default_budget() == 200_000
    assert memory_budget.default_budget(analyses_at_once=4) == 50_000
    streamed = recording_streams(monkeypatch)
    analysis = pipeline.analyze_report(LEAK, keep_events=False)
    assert streamed == [LEAK] and analysis.peak.peak_bytes == 5_682_335_061
    monkeypatch.setattr(memory_budget, "_available", lambda: 800_000)  # 400 kB: room for the frame
    pipeline.analyze_report(LEAK, keep_events=False)
    assert streamed == [LEAK]


def test_the_cgroup_limit_counts_less_what_the_group_uses(tmp_path):
    (tmp_path / "memory.max").write_text("max\n")
    assert memory_budget._cgroup_room(tmp_path) is None  # cgroup v2 without a limit
    (tmp_path / "memory.max").write_text("4294967296\n")
    (tmp_path / "memory.current").write_text("1073741824\n")
    assert memory_budget._cgroup_room(tmp_path) == 3 * GiB
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory_budget._cgroup_room(v1) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text("2147483648\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("3221225472\n")  # over its limit: no room
    assert memory_budget._cgroup_room(v1) == 0
    assert memory_budget._cgroup_room(tmp_path / "absent") is None


@pytest.mark.skipif(sys.platform == "win32", reason="no address-space limit on Windows")
def test_an_address_space_limit_leaves_half_of_it_for_resident_memory():
    six = 6 * GiB
    probe = ("from nsysan.runtime import memory_budget as m; "
             "print(m._address_space_limit(), m.usable_memory() <= m._address_space_limit())")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (six, six)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(3 * GiB), "True"]


def test_max_memory_on_the_command_line():
    small = nsysan_cli("analyze", str(LEAK), "--format", "json", "--no-progress", "--max-memory", "100kB")
    large = nsysan_cli("analyze", str(LEAK), "--format", "json", "--no-progress", "--max-memory", "8GiB")
    assert small.returncode == large.returncode == 0, small.stderr + large.stderr
    assert small.stdout == large.stdout
    assert json.loads(small.stdout)["never_freed_total"] == 124
    bad = nsysan_cli("analyze", str(LEAK), "--max-memory", "lots")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "nsysan: --max-memory 'lots' is not a size; write it like 8GiB, 512MiB, 900MB or 0"]


def test_max_memory_in_a_batch(tmp_path):
    inputs = [str(FIXTURES / f"{name}.sqlite") for name in ("torch_leak_v25", "ddp_leak_v25")]
    rows = {}
    for budget in ("1kB", "8GiB"):
        done = nsysan_cli("batch", *inputs, "-o", str(tmp_path / budget), "-j", "2", "--no-progress",
                          "--max-memory", budget)
        assert done.returncode == 0, done.stderr
        with open(tmp_path / budget / "summary.csv", newline="") as summary:
            rows[budget] = [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(summary)]
    assert rows["1kB"] == rows["8GiB"] and len(rows["1kB"]) >= 3
    bad = nsysan_cli("batch", *inputs, "-o", str(tmp_path / "bad"), "--max-memory", "-1GiB")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_the_python_api_takes_a_size_or_bytes(monkeypatch):
    assert (memory_budget.budget_bytes("1GiB"), memory_budget.budget_bytes(5), memory_budget.budget_bytes(None)) == \
        (GiB, 5, None)
    streamed = recording_streams(monkeypatch)
    assert nsysan.analyze(LEAK, keep_events=False, max_memory="100kB").peak.peak_bytes == 5_682_335_061
    assert streamed == [LEAK]  # 100 kB is under the 330,720 bytes of its whole frame
    with pytest.raises(NsysanError, match="--max-memory 'lots' is not a size"):
        nsysan.analyze(LEAK, keep_events=False, max_memory="lots")
