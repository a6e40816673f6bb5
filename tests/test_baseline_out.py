"""`--baseline-out FILE` (analyze and check): a baseline to commit that holds only what check and
compare read, a few kB, diff-friendly, and that they read as they read the whole analysis."""

from __future__ import annotations

import json

import pytest
from conftest import analysis_of
from test_check_measured import cli, fixture

from nsysan.runs.compare_runs import compare_analyses
from nsysan.runs.gate import evaluate_limits
from nsysan.runs.limits import Limits
from nsysan.render.json import dumps, render_json


@pytest.fixture(autouse=True)
def no_config(tmp_path, monkeypatch):
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", ["torch_clean_v25", "ddp_leak_v25"])
def test_a_baseline_is_small_sorted_and_read_as_the_run(name, tmp_path, capsys):
    path = tmp_path / "base.json"
    code, _, err = cli(capsys, "analyze", fixture(name), "--baseline-out", str(path), "--format", "json")
    assert code == 0, err
    text = path.read_text()
    whole = render_json(analysis_of(name))
    # torch_clean_v25: 19 kB of 333 kB; ddp_leak_v25 (two ranks, NCCL's sites): 43 kB of 506 kB
    assert len(text) < len(whole) / 10
    document = json.loads(text)
    assert text == dumps(document) + "\n"  # keys sorted, indented: a refresh diffs line by line
    assert document["scope"] == "baseline" and document["schema"] == "nsysan/analysis@1"
    assert all(len(s["ts_ns"]) == 1 for s in document["timeline"]["series"])
    assert document["never_freed"] == [] and all(p["live_at_peak"] == [] for p in document["peaks"])
    from nsysan import load_analysis

    base, full = load_analysis(path), analysis_of(name)
    # compare and check read the baseline as the whole analysis
    assert compare_analyses(base, full).identical
    assert compare_analyses(base, analysis_of("torch_leak_v25")) == compare_analyses(full, analysis_of("torch_leak_v25"))
    limits = Limits.parse(max_peak_increase="5%", max_never_freed="2GiB", max_growth_per_step="16MiB")
    leak = analysis_of("torch_leak_v25")
    assert evaluate_limits(leak, base, limits).outcomes == evaluate_limits(leak, full, limits).outcomes


def test_check_writes_the_run_it_checked_as_the_next_baseline(tmp_path, capsys):
    by_analyze, by_check = tmp_path / "a.json", tmp_path / "c.json"
    cli(capsys, "analyze", fixture("torch_leak_v25"), "--baseline-out", str(by_analyze), "--format", "json")
    code, out, _ = cli(capsys, "check", fixture("torch_leak_v25"), "--baseline", fixture("torch_clean_v25"),
                       "--max-peak-increase", "10%", "--baseline-out", str(by_check))
    assert code == 1 and out.startswith("FAIL")  # written all the same: the refresh to review
    assert by_check.read_bytes() == by_analyze.read_bytes()
    # never over the baseline it checks against (a regression would approve itself)
    before = by_analyze.read_bytes()
    code, _, err = cli(capsys, "check", fixture("torch_leak_v25"), "--baseline", str(by_analyze),
                       "--max-peak-increase", "10%", "--baseline-out", str(by_analyze))
    assert code == 2 and by_analyze.read_bytes() == before and "a.json" in err


def test_a_quick_analysis_is_no_baseline(tmp_path, capsys):
    code, _, err = cli(capsys, "analyze", fixture("torch_clean_v25"), "--quick", "--baseline-out",
                       str(tmp_path / "b.json"))
    assert code == 2 and "--baseline-out needs the full analysis" in err and not (tmp_path / "b.json").exists()
