"""`compare`: two runs matched by role, never by pid; the model case torch_clean_v25 -> torch_leak_v25.

Expected numbers come from the truth files: both torch runs train the same model, so the
driver-level bytes differ by what PyTorch's caching allocator reserved (`peak_reserved` after the
last step); the library workspaces are the same in both and cancel out.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import FIXTURES, ROOT, analysis_of, truth
from test_check import run as run_in_process

from nsysan.runs.compare_runs import compare_analyses
from nsysan.model import Comparison
from nsysan.model import Analysis
from nsysan.base.units import fmt_bytes


def run(*args: str) -> subprocess.CompletedProcess:
    """`nsysan ARGS` in this process, from the project's root (test_check.run)."""
    return run_in_process(*args, cwd=ROOT)


def reserved_peak(name: str) -> int:
    return [r for r in truth(name) if "step" in r][-1]["peak_reserved"]


# 5546967040 - 1746927616: the leak keeps each step's graph, the clean run does not.
KEPT_BY_THE_LEAK = reserved_peak("torch_leak_v25") - reserved_peak("torch_clean_v25")


def test_a_run_against_itself_is_identical():
    ddp = analysis_of("ddp_leak_v25")
    c = compare_analyses(ddp, ddp)
    assert c.identical
    assert c.sites == [] and c.ranges == []
    # ddp_leak_v25 has two processes on two GPUs (rank 1 on GPU 1 leaks): each matched to itself
    assert {(d.base_pid, d.new_pid) for d in c.processes} == {(p.pid, p.pid) for p in ddp.capture.processes}
    for d in c.processes:
        assert (d.peak.delta, d.end.delta, d.never_freed.delta) == (0, 0, 0)
        assert d.peak.before == d.peak.after and d.peak.percent == 0.0
    assert c.headline.startswith("no difference")


def test_the_cli_says_so_in_one_line():
    result = run("compare", "fixtures/ddp_leak_v25.sqlite", "fixtures/ddp_leak_v25.sqlite")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1
    assert result.stdout.startswith("ddp_leak_v25.sqlite → ddp_leak_v25.sqlite: no difference")


def test_clean_to_leak_shows_the_growth_and_the_sites_responsible():
    c = compare_analyses(analysis_of("torch_clean_v25"), analysis_of("torch_leak_v25"))
    assert not c.identical and c.matched_by == "gpu"
    (gpu0,) = c.processes
    assert gpu0.role == "GPU 0"
    assert gpu0.base_pid != gpu0.new_pid  # different pids, matched all the same
    assert gpu0.peak.delta == KEPT_BY_THE_LEAK == 3_800_039_424
    # both runs hold every byte to the end (the caching allocator never gives segments back)
    assert gpu0.never_freed.delta == KEPT_BY_THE_LEAK
    assert c.headline.startswith("peak +3.5 GiB (+201.9%) on GPU 0")  # 1.8 GiB -> 5.3 GiB
    grown = [s for s in c.sites if s.kind == "device"]
    # the kept graph's allocations: made in forward (python3) and backward (the autograd thread)
    assert [s.label for s in grown[:2]] == ["cudaMalloc in forward [python3]", "cudaMalloc in backward [pt_autograd_0]"]
    assert all(s.status == "grew" for s in grown)
    assert sum(s.max_live.delta for s in grown) == KEPT_BY_THE_LEAK
    assert "top growing site: cudaMalloc in forward [python3]" in c.headline
    assert {"forward", "backward"} <= {r.name for r in c.ranges}


def test_pids_do_not_decide_the_match():
    """The same run with other pids, in the other order, is still identical to itself."""
    ddp = analysis_of("ddp_leak_v25")
    text = json.dumps(ddp.to_dict())
    renumbered = text
    for old, new in zip(sorted(p.pid for p in ddp.capture.processes), (9001, 17)):
        renumbered = renumbered.replace(f'"pid": {old}', f'"pid": {new}')
    other = Analysis.from_dict(json.loads(renumbered))
    assert {p.pid for p in other.capture.processes} == {9001, 17}
    c = compare_analyses(ddp, other)
    assert c.identical, c.headline


def test_processes_without_distinct_gpus_are_matched_by_name_and_start_order():
    """known_mem_v25 has one process; a copy with a second process of the same name on the same
    GPU (added as a group) cannot be matched by GPU: name and start order are used."""
    known = analysis_of("known_mem_v25")
    doc = known.to_dict()
    clone = json.loads(json.dumps(doc))
    pid = doc["capture"]["processes"][0]["pid"]
    extra = dict(doc["capture"]["processes"][0], pid=pid + 1)
    clone["capture"]["processes"].append(extra)
    clone["groups"] += [dict(g, pid=pid + 1) for g in doc["groups"]]
    clone["peaks"] += [dict(p, pid=pid + 1) for p in doc["peaks"] if p["pid"] == pid]
    c = compare_analyses(known, Analysis.from_dict(clone))
    assert c.matched_by == "name"
    name = doc["capture"]["processes"][0]["name"]
    assert [d.role for d in c.processes] == [f"{name} #1 · GPU 0", f"{name} #2 · GPU 0"]
    assert c.processes[0].peak.delta == 0 and c.processes[1].base_pid is None
    assert f"new: {name} #2 · GPU 0" in c.headline


def test_comparison_round_trips_through_json():
    c = compare_analyses(analysis_of("torch_clean_v25"), analysis_of("torch_leak_v25"))
    assert Comparison.from_dict(json.loads(json.dumps(c.to_dict()))) == c


def test_compare_json_and_folder(tmp_path):
    base_json = tmp_path / "base.analysis.json"
    written = run("analyze", "fixtures/torch_clean_v25.sqlite", "--json", str(base_json), "--format", "json")
    assert written.returncode == 0, written.stderr
    result = run("compare", str(base_json), "fixtures/torch_leak_v25.sqlite", "--format", "json",
                 "-o", str(tmp_path / "cmp"))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "nsysan/compare@1"
    assert doc["processes"][0]["peak"]["delta"] == KEPT_BY_THE_LEAK
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["compare.html", "compare.json", "compare.png"]
    assert json.loads((tmp_path / "cmp" / "compare.json").read_text()) == doc
    page = (tmp_path / "cmp" / "compare.html").read_text()
    assert "peak +3.5 GiB (+201.9%) on GPU 0" in page and "cudaMalloc in forward [python3]" in page
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_profile_string_is_escaped_in_the_page(tmp_path):
    from nsysan.render.compare_data import render_comparison_html

    known = analysis_of("known_mem_v25").to_dict()
    hostile = json.loads(json.dumps(known).replace('"burst"', '"<script>alert(1)</script>"'))
    c = compare_analyses(Analysis.from_dict(known), Analysis.from_dict(hostile))
    page = render_comparison_html(c, Analysis.from_dict(known), Analysis.from_dict(hostile))
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


@pytest.mark.parametrize("bad", ["corrupt", "missing", "not_ours"])
def test_bad_input_is_one_line_and_exit_2(bad, tmp_path):
    path = tmp_path / "bad.sqlite"
    if bad == "corrupt":
        path.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes()[:3000])
    elif bad == "not_ours":
        path = tmp_path / "other.json"
        path.write_text('{"schema": "someone/else@3"}')
    result = run("compare", "fixtures/known_mem_v25.sqlite", str(path))
    assert result.returncode == 2
    assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert path.name in result.stderr


def test_ranks_from_the_environment_decide_the_match():
    """With RANK known for every process, rank k meets rank k wherever it ran: here the same
    ddp run with the ranks written the other way round pairs each process with the other one."""
    ddp = analysis_of("ddp_leak_v25").to_dict()
    pids = sorted(p["pid"] for p in ddp["capture"]["processes"])

    def with_ranks(ranks: dict[int, int]) -> Analysis:
        doc = json.loads(json.dumps(ddp))
        for proc in doc["capture"]["processes"]:
            proc.update(rank=ranks[proc["pid"]], rank_source="environment", label=f"rank {ranks[proc['pid']]}")
        return Analysis.from_dict(doc)

    c = compare_analyses(with_ranks({pids[0]: 0, pids[1]: 1}), with_ranks({pids[0]: 1, pids[1]: 0}))
    assert c.matched_by == "rank"
    assert [(d.role, d.base_pid, d.new_pid) for d in c.processes] == \
        [("rank 0 · GPU 1", pids[0], pids[1]), ("rank 1 · GPU 0", pids[1], pids[0])]
    assert not c.identical


def test_the_plot_draws_both_runs_from_their_first_step():
    from nsysan.render.compare_plot import plot_comparison

    clean, leak = analysis_of("torch_clean_v25"), analysis_of("torch_leak_v25")
    fig = plot_comparison(compare_analyses(clean, leak), clean, leak)
    (ax,) = fig.axes
    lines = {line.get_gid(): line for line in ax.get_lines()}
    assert set(lines) == {"compare:base", "compare:new"}
    assert ax.get_xlabel() == "s from the first step"  # both runs mark "step N" with NVTX
    # y in GiB: the new run's curve reaches its peak, the base run's its own
    assert ax.get_ylabel() == "GiB"
    assert max(lines["compare:new"].get_ydata()) * (1 << 30) == pytest.approx(leak.peak.peak_bytes)
    assert max(lines["compare:base"].get_ydata()) * (1 << 30) == pytest.approx(clean.peak.peak_bytes)
    assert min(lines["compare:new"].get_xdata()) < 0 < max(lines["compare:new"].get_xdata())  # setup before step 0


def test_clean_to_leak_names_the_new_growth():
    c = compare_analyses(analysis_of("torch_clean_v25"), analysis_of("torch_leak_v25"))
    (gpu0,) = c.processes
    assert (gpu0.growth_before, gpu0.growth_after) == ("stable", "growing")
    # PyTorch's reserved bytes grow by about 740 MiB a step in the leak (truth), not in the clean run
    reserved = [r["reserved"] for r in truth("torch_leak_v25") if "step" in r]
    per_step = sorted(b - a for a, b in zip(reserved[1:], reserved[2:]))[len(reserved[2:]) // 2]
    assert abs(gpu0.growth_per_step.after - per_step) < 0.02 * per_step
    assert f"new growth of {fmt_bytes(gpu0.growth_per_step.after)} per step on GPU 0" in c.headline
