"""`check` never passes what it cannot see (issue 26): a limit it cannot measure is a `not measured`
line, exit code 2 unless --allow-unmeasured, and a JUnit <error>; --no-failed-allocations fails an
allocator OOM the trace shows without a failed call and passes a probe; numbers keep the digits
that tell a measurement from its limit.

In-process (`nsysan.cli.main`): a subprocess would prove nothing more here.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from conftest import FIXTURES, analysis_of, truth
from test_check import assert_junit_schema
from test_documents import cli  # noqa: F401 (test_step_range_options imports it from here)
from nsysan.runs.gate import evaluate_limits
from nsysan.runs.limits import Limits
from nsysan.base.units import fmt_bytes_apart, fmt_percent_apart


def fixture(name: str) -> str:
    return str(FIXTURES / f"{name}.sqlite")


@pytest.fixture(autouse=True)
def no_config(tmp_path, monkeypatch):
    """Run where no pyproject.toml sets limits: the top of a repository of its own."""
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)


def test_a_capture_without_sizes_is_not_measured(tmp_path, capsys):
    # known_plain_v25 was captured without --cuda-memory-usage: no sizes (fixtures/README.md)
    code, out, err = cli(capsys, "check", fixture("known_plain_v25"), "--max-peak", "1GiB", "--max-never-freed", "0",
                         "--no-failed-allocations", "--junit", str(tmp_path / "junit.xml"))
    assert code == 2
    lines = out.splitlines()
    assert lines[0] == ("NOT MEASURED: 2 of 3 limit checks could not be measured (known_plain_v25.sqlite); "
                        "--allow-unmeasured lets the others decide")
    assert lines[1].startswith("  not measured  max-peak: peak not measured: known_plain_v25.sqlite: sizes were not "
                               "collected: the capture did not use --cuda-memory-usage=true")
    assert lines[2].startswith("  not measured  max-never-freed: never freed not measured: ")
    assert lines[3] == "  ok      no-failed-allocations: no failed allocation (process 1424 /tmp/known)"
    assert "0 B" not in out and err.count("\n") == 1 and "could not be measured" in err
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert_junit_schema(root)
    suite = root.find("testsuite")
    assert (suite.attrib["tests"], suite.attrib["failures"], suite.attrib["errors"]) == ("3", "0", "2")
    errors = [c.find("error") for c in suite.iter("testcase") if c.find("error") is not None]
    assert {e.attrib["type"] for e in errors} == {"not_measured"}
    # jax_oom_v25: --cuda-memory-usage was on, but nsys's importer failed part-way: no memory table
    code, out, _ = cli(capsys, "check", fixture("jax_oom_v25"), "--max-peak", "1GiB")
    assert code == 2 and out.splitlines()[1] == (
        "  not measured  max-peak: peak not measured: jax_oom_v25.sqlite: --cuda-memory-usage was on, but no memory "
        "events were recorded (no allocation was traced, or the process ended before nsys flushed them) (all)")
    # allowed: the limit that was measured decides
    code, out, _ = cli(capsys, "check", fixture("known_plain_v25"), "--max-peak", "1GiB", "--no-failed-allocations",
                       "--allow-unmeasured")
    assert code == 0
    assert out.startswith("PASS: 1 of 2 limit checks hold, 1 not measured (allowed by --allow-unmeasured)")


def test_a_baseline_without_a_matching_process_is_not_measured(capsys):
    # ddp_leak_v25 has a process on GPU 0 and one on GPU 1; torch_clean_v25 one on GPU 0 only
    code, out, _ = cli(capsys, "check", fixture("ddp_leak_v25"), "--baseline", fixture("torch_clean_v25"),
                       "--max-peak-increase", "5%")
    assert code == 2
    assert ("  not measured  max-peak-increase: peak increase not measured: process 2147 python on GPU 1 has no "
            "match in the baseline torch_clean_v25.sqlite (process 2147 python on GPU 1)") in out.splitlines()
    assert "ok      max-peak-increase: peak increase -722.2 MiB (-40.2%)" in out  # GPU 0 is matched
    # a baseline without sizes matches nothing
    verdict = evaluate_limits(analysis_of("torch_clean_v25"), analysis_of("known_plain_v25"),
                              Limits.parse(max_peak_increase="5%"))
    ((outcome,), status) = verdict.outcomes, verdict.status
    assert (status, outcome.status, outcome.measured, outcome.ok) == ("not_measured", "not_measured", None, False)
    assert "known_plain_v25.sqlite: sizes were not collected" in outcome.message


def test_growth_hidden_by_a_preallocation_is_not_measured(capsys):
    # jax_prealloc_v25: XLA preallocated 104.9 GiB; the program's own use grows 512 MiB a step
    # (truth: bytes_in_use 1.1 -> 3.8 GB) inside it, which the trace cannot see
    in_use = [r["bytes_in_use"] for r in truth("jax_prealloc_v25") if "bytes_in_use" in r]
    assert in_use[-1] - in_use[0] > 2 << 30
    code, out, _ = cli(capsys, "check", fixture("jax_prealloc_v25"), "--max-growth-per-step", "16MiB")
    assert code == 2
    assert out.splitlines()[1] == (
        "  not measured  max-growth-per-step: growth per step not measured: process 607 on GPU 0: XLA preallocated "
        "104.9 GiB and allocates inside it, out of the trace's sight, so growth per step cannot be seen; run with "
        "XLA_PYTHON_CLIENT_PREALLOCATE=false or XLA_PYTHON_CLIENT_ALLOCATOR=platform to see it "
        "(process 607 python3 on GPU 0)")
    for per in ("process", "gpu", "all"):  # a GPU's sum is not measured when one of its processes is not
        verdict = evaluate_limits(analysis_of("jax_prealloc_v25"), None,
                                  Limits.parse(per=per, max_growth_per_step="16MiB", max_never_freed="1GiB",
                                               max_peak="120GiB"))
        # the kept gradients are inside the block too: never-freed bytes are not seen either; the
        # peak, the reservation itself, is
        assert [(o.limit, o.status) for o in verdict.outcomes] == [
            ("max-peak", "held"), ("max-never-freed", "not_measured"), ("max-growth-per-step", "not_measured")]
        assert "XLA preallocated 104.9 GiB" in verdict.outcomes[1].message


def test_steps_the_trace_ends_before_say_so(capsys):
    # known_mem_v22: nsys 2022.4 traced the CUDA 13 program only partly (one memory event) while
    # its nine NVTX steps are all there: the advice is about the trace, not about marking steps
    code, out, _ = cli(capsys, "check", fixture("known_mem_v22"), "--max-growth-per-step", "16MiB")
    assert code == 2
    assert out.splitlines()[1] == (
        "  not measured  max-growth-per-step: growth per step not measured: process 1212 on GPU 0: the CUDA trace "
        "stops before 9 of its 9 steps end, so growth is not judged (process 1212 /tmp/known on GPU 0)")
    assert "mark each" not in out
    # and without steps at all, the advice is how to mark them
    code, out, _ = cli(capsys, "check", fixture("real_oom_v25"), "--max-growth-per-step", "16MiB")
    assert code == 2 and "no training steps found" in out and "torch.cuda.nvtx.range_push" in out


def test_an_allocator_oom_without_a_failed_call_fails(capsys):
    # torch_oom_v25: PyTorch raised OutOfMemoryError at step 5 under a memory-fraction cap, no
    # cudaMalloc failed (fixtures/README.md, torch_oom_v25.stderr.txt)
    assert "OutOfMemoryError" in (FIXTURES / "torch_oom_v25.stderr.txt").read_text()
    assert analysis_of("torch_oom_v25").failed_calls == []
    code, out, _ = cli(capsys, "check", fixture("torch_oom_v25"), "--no-failed-allocations")
    assert code == 1
    assert out.splitlines()[1] == (
        "  broken  no-failed-allocations: out of memory without a failing call: the allocator freed its cache "
        "(1.1 GiB) at 8.745 s and the process ended inside step 5 > hoard (process 1872 python3)")
    per_all = evaluate_limits(analysis_of("torch_oom_v25"), None, Limits.parse(per="all", no_failed_allocations=True))
    assert [(o.where, o.status, o.measured) for o in per_all.outcomes] == [("all", "broken", 1)]
    # with the program's stderr, its request joins the line: "Tried to allocate 1.50 GiB"
    assert "Tried to allocate 1.50 GiB" in (FIXTURES / "torch_oom_v25.stderr.txt").read_text()
    code, out, _ = cli(capsys, "check", fixture("torch_oom_v25"), "--no-failed-allocations",
                       "--log", str(FIXTURES / "torch_oom_v25.stderr.txt"))
    assert code == 1 and out.splitlines()[1].endswith(
        "ended inside step 5 > hoard; torch_oom_v25.stderr.txt line 8: could not get 1.5 GiB (process 1872 python3)")


def test_an_oom_only_the_log_shows_fails(capsys):
    # jax_oom_v25: XLA's RESOURCE_EXHAUSTED for 20 GiB (its stderr); the degraded capture has no
    # memory table and no failed call, so only the log tells
    assert "RESOURCE_EXHAUSTED" in (FIXTURES / "jax_oom_v25.stderr.txt").read_text()
    code, out, _ = cli(capsys, "check", fixture("jax_oom_v25"), "--no-failed-allocations")
    assert code == 0 and out.splitlines() == ["PASS: all 1 limit checks hold (jax_oom_v25.sqlite)",
                                              "  ok      no-failed-allocations: no failed allocation (all)"]
    code, out, _ = cli(capsys, "check", fixture("jax_oom_v25"), "--no-failed-allocations",
                       "--log", str(FIXTURES / "jax_oom_v25.stderr.txt"))
    assert code == 1 and out.splitlines()[1] == (
        "  broken  no-failed-allocations: out of memory without a failing call: jax_oom_v25.stderr.txt line 2: "
        "could not get 20.0 GiB (process 559)")


def test_a_probe_is_not_a_failed_allocation(capsys):
    # torch_expandable_v25: cuMemCreate fails once with CUDA_ERROR_NOT_PERMITTED and is retried at
    # once (a feature probe; analyze: diagnostic `probe`, info)
    (failed,) = analysis_of("torch_expandable_v25").failed_calls
    assert (failed.api, failed.error) == ("cuMemCreate", "CUDA_ERROR_NOT_PERMITTED")
    code, out, _ = cli(capsys, "check", fixture("torch_expandable_v25"), "--no-failed-allocations")
    assert code == 0, out
    assert out.splitlines()[1] == (
        "  ok      no-failed-allocations: no failed allocation; 1 probe retried at once (cuMemCreate → "
        "CUDA_ERROR_NOT_PERMITTED) is not a failure (process 2594 python3)")
    # a real failed cudaMalloc still fails (real_oom_v25, call #9)
    code, out, _ = cli(capsys, "check", fixture("real_oom_v25"), "--no-failed-allocations")
    assert code == 1 and "1 failed allocation, the first cudaMalloc → cudaErrorMemoryAllocation" in out


def test_numbers_keep_the_digits_that_tell_them_apart(capsys):
    peak = analysis_of("torch_oom_v25").peaks[0].peak_bytes
    assert peak == 5908827477  # 5.503 GiB: "5.5 GiB" at one decimal, like a limit of 5.5GiB
    code, out, _ = cli(capsys, "check", fixture("torch_oom_v25"), "--max-peak", "5.5GiB")
    assert code == 1 and "peak 5.503 GiB is over the limit of 5.500 GiB" in out
    code, out, _ = cli(capsys, "check", fixture("torch_oom_v25"), "--max-peak", str(peak - 1))
    assert code == 1 and "peak 5,908,827,477 B is over the limit of 5,908,827,476 B" in out
    code, out, _ = cli(capsys, "check", fixture("torch_leak_v25"), "-b", fixture("torch_clean_v25"),
                       "--max-peak-increase", "201.9%")
    assert code == 0 and "(+201.88%), 1.8 GiB → 5.3 GiB, is within the limit of +201.90%" in out
    assert fmt_bytes_apart(1 << 30, 1 << 30) == ("1.0 GiB", "1.0 GiB")
    assert fmt_percent_apart(10.0004, 10.0) == ("+10.0004%", "+10.0000%")


def test_the_json_verdict_carries_the_status(tmp_path, capsys):
    path = tmp_path / "verdict.json"
    code, _, _ = cli(capsys, "check", fixture("jax_prealloc_v25"), "--max-growth-per-step", "16MiB",
                     "--max-peak", "200GiB", "--json", str(path))
    verdict = json.loads(path.read_text())
    assert code == 2 and (verdict["status"], verdict["ok"], verdict["allow_unmeasured"]) == ("not_measured", False,
                                                                                            False)
    assert [(o["limit"], o["status"], o["ok"]) for o in verdict["outcomes"]] == [
        ("max-peak", "held", True), ("max-growth-per-step", "not_measured", False)]


def test_the_command_line_switches_off_a_limit_of_the_config(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.nsysan.check]\nmax-peak-increase = "5%"\nmax-peak = "1GiB"\n'
                                             "no-failed-allocations = true\n")
    # torch_oom_v25: peak 5.5 GiB over 1 GiB, and its allocator ran out of memory
    code, out, err = cli(capsys, "check", fixture("torch_oom_v25"))
    assert code == 2 and "needs a baseline" in err  # max-peak-increase set, no --baseline
    code, out, _ = cli(capsys, "check", fixture("torch_oom_v25"), "--max-peak-increase", "none")
    assert code == 1 and out.startswith("FAIL: 2 of 2 limit checks broken")
    code, out, _ = cli(capsys, "check", fixture("torch_oom_v25"), "--max-peak-increase", "none", "--max-peak", "NONE",
                       "--allow-failed-allocations", "--max-never-freed", "8GiB")
    assert code == 0 and out.splitlines() == [
        "PASS: all 1 limit checks hold (torch_oom_v25.sqlite)",
        "  ok      max-never-freed: never freed 4.5 GiB is within the limit of 8.0 GiB (process 1872 python3 on GPU 0)"]


@pytest.mark.parametrize("line,message", [
    ("max-peak = 8", 'max-peak = 8 is a number without a unit; write it as a string with one, like '
                     'max-peak = "8GiB" ("8B" for bytes)'),
    ("max-peak-increase = 5", 'max-peak-increase = 5 is a number without a unit; write it as a string with one, '
                              'like max-peak-increase = "5%"'),
    ("no-failed-allocations = 1", "no-failed-allocations = 1: use true or false"),
])
def test_a_bare_number_in_the_config_is_refused(tmp_path, capsys, line, message):
    (tmp_path / "pyproject.toml").write_text(f"[tool.nsysan.check]\n{line}\n")
    code, out, err = cli(capsys, "check", fixture("known_mem_v25"))
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err
    (tmp_path / "pyproject.toml").write_text("[tool.nsysan.check]\nmax-never-freed = 0\n")  # zero needs no unit
    code, out, _ = cli(capsys, "check", fixture("known_mem_v25"))
    assert code == 1 and "never freed 146.0 MiB is over the limit of 0 B" in out


def test_a_check_that_cannot_run_still_writes_its_reports(tmp_path, capsys, monkeypatch):
    corrupt = tmp_path / "run.sqlite"
    corrupt.write_bytes((FIXTURES / "known_mem_v25.sqlite").read_bytes()[:3000])
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    files = {name: tmp_path / name for name in ("verdict.json", "junit.xml", "check.md")}
    code, out, err = cli(capsys, "check", str(corrupt), "--max-peak", "1GiB", "--json", str(files["verdict.json"]),
                         "--junit", str(files["junit.xml"]), "--markdown", str(files["check.md"]), "--github-summary")
    assert code == 2 and out == "" and err.count("\n") == 1
    why = err.removeprefix("nsysan: ").strip()
    assert "run.sqlite is truncated" in why
    verdict = json.loads(files["verdict.json"].read_text())
    assert (verdict["status"], verdict["ok"], verdict["error"], verdict["outcomes"]) == ("error", False, why, [])
    root = ET.parse(files["junit.xml"]).getroot()
    assert_junit_schema(root)
    (error,) = root.iter("error")
    assert (error.attrib["type"], error.attrib["message"]) == ("input", why)
    assert summary.read_text() == files["check.md"].read_text()
    assert files["check.md"].read_text().startswith("### ⚠️ nsysan check: ERROR")
