"""Which rank started it across reports, one report per rank (issue 30, section 5): the real
capture torch_rank0_v25 / torch_rank1_v25 (torchrun, each rank under its own `nsys profile -o
torch_rank%q{RANK}_v25`, both on one GPU, a gloo barrier before each step; rank 1 keeps 64 MiB per
step from step 3 on, inside 'backward', at torch_rank_reports.py's LEAK line)."""

from __future__ import annotations

import json
import re
import sqlite3

from conftest import FIXTURES, analysis_of, cli, truth

from nsysan.render.json import render_json

MiB = 1 << 20
ROOT = FIXTURES.parent
WORKLOAD = FIXTURES / "workloads" / "torch_rank_reports.py"


def _leak_line() -> int:
    return next(n for n, line in enumerate(WORKLOAD.read_text().splitlines(), 1) if "# LEAK" in line)


def _first_kept_step(rank: int) -> dict:
    return next(r for r in truth(f"torch_rank{rank}_v25") if r["kept_mib"] > 0)


def test_each_report_names_its_rank_and_its_clock():
    for rank in (0, 1):
        analysis = analysis_of(f"torch_rank{rank}_v25")
        (proc,) = analysis.capture.processes
        assert (proc.rank, proc.world_size, proc.rank_source, proc.label) == (rank, 2, "environment", f"rank {rank}")
        assert proc.pid == truth(f"torch_rank{rank}_v25")[0]["pid"]
        with sqlite3.connect(FIXTURES / f"torch_rank{rank}_v25.sqlite") as conn:
            (start,) = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        assert analysis.capture.session_start_utc_ns == start
    # rank 0 never departs; rank 1 grows exactly what it keeps per step (truth: allocated +64 MiB a step)
    (g0,) = analysis_of("torch_rank0_v25").growth
    (g1,) = analysis_of("torch_rank1_v25").growth
    allocated = [r["allocated"] for r in truth("torch_rank1_v25")]
    assert g0.verdict == "stable" and g1.verdict == "growing"
    assert g1.bytes_per_step == allocated[-1] - allocated[-2] == 64 * MiB


def _batch(capsys, tmp_path, *inputs):
    out = tmp_path / "out"
    code, stdout, err = cli(capsys, "batch", *map(str, inputs), "-o", str(out), "-j", "1", "--no-progress")
    assert code == 0, err
    return out, stdout


def test_batch_names_the_rank_report_step_and_site_that_departed(capsys, tmp_path):
    out, stdout = _batch(capsys, tmp_path, FIXTURES / "torch_rank0_v25.sqlite", FIXTURES / "torch_rank1_v25.sqlite")
    fleets = json.loads((out / "fleets.json").read_text())
    assert fleets["schema"] == "nsysan/fleets@1"
    (fleet,) = fleets["fleets"]
    departure = fleet["departure"]
    first = _first_kept_step(1)  # the first step at whose end rank 1 kept memory: step 3
    assert (departure["rank"], departure["step"]) == (1, first["step"]) == (1, 3)
    assert departure["report"].endswith("torch_rank1_v25.sqlite")
    before = next(r for r in truth("torch_rank1_v25") if r["step"] == first["step"] - 1)
    assert departure["step_bytes"] == first["allocated"] - before["allocated"] == 64 * MiB
    assert departure["others_bytes"] == 0 and departure["bytes_per_step"] == 64 * MiB
    assert departure["sites"][0] == f"main (torch_rank_reports.py:{_leak_line()}) in 'backward'"
    # On the UTC clock (each report's session start + the step's start), step 3 of rank 1 began
    # after rank 1's step 2 ended and before its step 3 ended (the program's own time.time_ns())
    assert before["unix_ns"] < departure["step_start_utc_ns"] < first["unix_ns"]
    # ... and the barrier before each step made both ranks start it together: within 1 ms
    assert 0 <= departure["step_spread_ns"] < 1_000_000
    lines = [line for line in stdout.splitlines() if line.startswith("  first")]
    assert lines == [f"  first   {departure['line']}"]
    assert departure["line"].startswith("rank 1 (torch_rank1_v25.sqlite) departs first, at step 3: +64.0 MiB where "
                                        "the other ranks added at most 0 B; it then grows 64.0 MiB per step, from main "
                                        f"(torch_rank_reports.py:{_leak_line()}) in 'backward'; step 3 began at 2026-12-02 ")
    assert fleet["name"].endswith("torch_rank*_v25.sqlite") and fleet["ranks"] == 2
    page = (out / "summary.html").read_text()
    assert "first to depart:</strong> rank 1 (torch_rank1_v25.sqlite) departs first, at step 3" in page
    assert "in &#39;backward&#39;" in page  # escaped, as every profile string


def test_documents_read_back_give_the_same_departure(capsys, tmp_path):
    """Batch over the analysis documents (named by rank only through their environment): the
    document carries the session start, so the departure and its clock are the same."""
    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        (job / f"prof_{rank}.analysis.json").write_text(render_json(analysis_of(f"torch_rank{rank}_v25")))
    out, _ = _batch(capsys, tmp_path, job)
    (fleet,) = json.loads((out / "fleets.json").read_text())["fleets"]
    assert fleet["name"].endswith("job/*")  # no rank in the names: the environment's RANK groups them
    again = fleet["departure"]
    out2, _ = _batch(capsys, tmp_path / "direct", FIXTURES / "torch_rank0_v25.sqlite",
                     FIXTURES / "torch_rank1_v25.sqlite")
    direct = json.loads((out2 / "fleets.json").read_text())["fleets"][0]["departure"]
    keys = ("rank", "step", "step_bytes", "others_bytes", "sites", "step_start_utc_ns", "step_spread_ns")
    assert {k: again[k] for k in keys} == {k: direct[k] for k in keys}
    assert again["where"] == "rank 1 (prof_1.analysis.json)"


def test_ranks_inside_one_report_depart_as_analyze_says(capsys, tmp_path, ddp_leak_v25):
    """A report of several ranks is its own fleet: the same rule as analyze's growth answer."""
    out, _ = _batch(capsys, tmp_path, FIXTURES / "ddp_leak_v25.sqlite")
    (fleet,) = json.loads((out / "fleets.json").read_text())["fleets"]
    (marked,) = [g for g in ddp_leak_v25.growth if g.departure_step is not None]
    departure = fleet["departure"]
    assert (departure["rank"], departure["step"], departure["step_bytes"], departure["others_bytes"]) == \
        (1, marked.departure_step, marked.departure_bytes, marked.others_bytes) == (1, 1, 196 * MiB, 0)
    assert "(on the report's clock)" in departure["line"]


def test_the_recorded_rank_wins_over_the_file_name(capsys, tmp_path):
    """Two copies of rank 0's report named rank0 and rank1: the environment of both says RANK=0,
    so they are one rank twice, not a job of two (no fleet, no departure)."""
    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        (job / f"rank{rank}.sqlite").write_bytes((FIXTURES / "torch_rank0_v25.sqlite").read_bytes())
    out, stdout = _batch(capsys, tmp_path, job)
    fleets = json.loads((out / "fleets.json").read_text())["fleets"]
    # both copies say RANK=0 in their environment: one rank, no fleet, and so no departure
    assert fleets == [] and "  first" not in stdout


def test_the_database_aligns_the_ranks_steps_on_one_clock(capsys, tmp_path):
    """docs/batch.md's fourth query: the reports' steps with their rank, on the UTC clock."""
    out, _ = _batch(capsys, tmp_path, FIXTURES / "torch_rank0_v25.sqlite", FIXTURES / "torch_rank1_v25.sqlite")
    clock = re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "batch.md").read_text(), flags=re.S)[3]
    with sqlite3.connect(out / "nsysan.db") as conn:
        rows = conn.execute(clock).fetchall()
    at_3 = [r for r in rows if r[0] == 3]
    departure = json.loads((out / "fleets.json").read_text())["fleets"][0]["departure"]
    # step 3: rank 1 first, +64 MiB, starting when the fleet view says; rank 0 added nothing
    assert [(r[1], r[2], r[3]) for r in at_3] == [(1, "torch_rank1_v25.sqlite", 64 * MiB), (0, "torch_rank0_v25.sqlite", 0)]
    assert at_3[0][4] == departure["step_start_utc_ns"]
    assert abs(at_3[0][4] - at_3[1][4]) == departure["step_spread_ns"]


def test_a_rank_found_twice_names_no_departure(capsys, tmp_path):
    """Two runs of one job in one folder (rank 1's report copied under another name): which
    report belongs with which is unknown, so no rank is said to depart."""
    job = tmp_path / "job"
    job.mkdir()
    for name, source in (("a.sqlite", 0), ("b.sqlite", 1), ("c.sqlite", 1)):
        (job / name).write_bytes((FIXTURES / f"torch_rank{source}_v25.sqlite").read_bytes())
    out, stdout = _batch(capsys, tmp_path, job)
    (fleet,) = json.loads((out / "fleets.json").read_text())["fleets"]
    assert fleet["ranks"] == 3 and fleet["departure"] is None and "  first" not in stdout
