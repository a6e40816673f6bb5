"""`nsysan analyze --quick`: the memory-usage table alone, with the same peaks and leaks as the
full analysis, on the real captures."""

from __future__ import annotations

import json

import pytest
from conftest import analysis_of, truth
from test_cli import run

import nsysan
from nsysan.errors import NsysanError
from nsysan.events import QUICK_API

WITH_SIZES = ["known_mem_v25", "known_bt_v25", "torch_leak_v25", "torch_expandable_v25", "ddp_leak_v25",
              "real_oom_v25", "known_mem_v22"]
_quick: dict[str, nsysan.Analysis] = {}


def quick_of(name: str) -> nsysan.Analysis:
    if name not in _quick:
        _quick[name] = nsysan.analyze(f"fixtures/{name}.sqlite", quick=True)
    return _quick[name]


@pytest.mark.parametrize("name", WITH_SIZES)
def test_quick_finds_the_same_peaks_groups_and_leaks_as_the_full_analysis(name):
    quick, full = quick_of(name), analysis_of(name)
    assert quick.scope == "quick" and full.scope == "full"

    def peak(p):
        return (p.pid, p.device, p.gpu, p.peak_bytes, p.peak_time_ns, p.live_count,
                [(a.address, a.bytes, a.alloc_time_ns) for a in p.live_at_peak])

    assert [peak(p) for p in quick.peaks] == [peak(p) for p in full.peaks]
    assert quick.groups == full.groups
    assert [(a.pid, a.address, a.bytes, a.alloc_time_ns) for a in quick.never_freed] == \
        [(a.pid, a.address, a.bytes, a.alloc_time_ns) for a in full.never_freed]
    assert quick.never_freed_total == full.never_freed_total
    assert quick.timeline.series == full.timeline.series


def test_quick_known_program_peak_and_leaks_match_the_truth():
    quick = quick_of("known_mem_v25")
    assert quick.peak.peak_bytes == 952107008
    leaked = {(r["ptr"], r["bytes"]) for r in truth("known_mem_v25") if r.get("freed") == 0}
    device = [a for a in quick.never_freed if a.kind == "device"]
    assert {(a.address, a.bytes) for a in device} == leaked
    assert sum(a.bytes for a in device) == 153067520


def test_quick_says_what_it_did_not_read():
    quick = quick_of("real_oom_v25")
    assert quick.sites == [] and quick.api_calls == [] and quick.failed_calls == [] and quick.ranges == []
    codes = [d.code for d in quick.diagnostics]
    assert "quick" in codes and "no_backtraces" not in codes
    # the full analysis finds the failed cudaMalloc; quick cannot, and its diagnostic says so
    assert analysis_of("real_oom_v25").failed_calls
    assert "failed calls" in next(d.message for d in quick.diagnostics if d.code == "quick")
    assert {a.api for a in quick.never_freed} <= {QUICK_API, "(module load)"}
    assert all(a.tid == -1 and a.nvtx_range == "" and a.site.label == "" for a in quick.never_freed)


def test_quick_needs_the_memory_table():
    with pytest.raises(NsysanError, match="--quick reads only the memory-usage table"):
        nsysan.analyze("fixtures/known_plain_v25.sqlite", quick=True)
    result = run("analyze", "--quick", "fixtures/known_plain_v25.sqlite", "--no-progress")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "--cuda-memory-usage=true" in result.stderr


def test_quick_on_the_command_line(tmp_path):
    result = run("analyze", "--quick", "fixtures/ddp_leak_v25.sqlite", "--no-progress",
                 "--json", str(tmp_path / "quick.json"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "1.6 GiB" in out and "Never freed during the capture: 44 allocations, 1.7 GiB" in out
    # no column the memory table cannot fill, no empty sites table
    tables = out.split("Diagnostics")[0]
    assert "reached by" not in tables and "NVTX range" not in tables and "Top allocation sites" not in tables
    assert "threads calling memory APIs" not in out
    assert "quick analysis (--quick)" in " ".join(out.split())
    document = json.loads((tmp_path / "quick.json").read_text())
    assert document["scope"] == "quick" and document["sites"] == []
    assert nsysan.load_analysis(tmp_path / "quick.json") == quick_of("ddp_leak_v25")


def test_documents_without_scope_are_full_analyses(tmp_path):
    document = analysis_of("known_mem_v25").to_dict()
    del document["scope"]  # written before nsysan knew --quick
    (tmp_path / "old.json").write_text(json.dumps(document))
    assert nsysan.load_analysis(tmp_path / "old.json").scope == "full"
