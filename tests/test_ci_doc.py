"""docs/ci.md works as written (issue 27): its limit tables, parsed out of the doc, pass the
healthy capture and break the leaking and out-of-memory ones; its example repository runs end to
end (install stand-in: the nsysan under test on PATH; capture stand-in: a copy of a fixture's
export), printing what the doc prints and leaving the artifacts it lists. After a change that
moves the output: NSYSAN_UPDATE_DOCS=1 python -m pytest tests/test_ci_doc.py, and review the diff."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, analysis_of, truth

from nsysan.runs.gate import evaluate_limits
from nsysan.runs.limits import Limits, read_config_file

DOC = (ROOT / "docs" / "ci.md").read_text()


def block_after(marker: str, lang: str) -> str:
    """The first ```lang block after `marker` in docs/ci.md."""
    start = DOC.index(marker)
    found = re.compile(rf"```{lang}\n(.*?)```", re.S).search(DOC, start)
    assert found is not None, f"no {lang} block after {marker!r}"
    return found.group(1)


def doc_limits(marker: str, tmp_path: Path) -> Limits:
    """The doc's table after `marker`, read as check reads a pyproject.toml."""
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\n\n' + block_after(marker, "toml"))
    table = read_config_file(path)
    assert table is not None
    return Limits.parse(defaults=table)


def verdict(run: str, base: str, limits: Limits):
    return evaluate_limits(analysis_of(run), analysis_of(base), limits)


def broken(v) -> set[str]:
    return {o.limit for o in v.broken}


def test_the_pytorch_table_passes_the_healthy_run_and_breaks_leak_and_oom(tmp_path):
    limits = doc_limits("For PyTorch", tmp_path)
    assert limits.max_never_freed is None  # a caching allocator "never frees" its cache by design
    clean = verdict("torch_clean_v25", "torch_clean_v25", limits)
    assert clean.status == "pass" and len(clean.outcomes) == 3
    leak = verdict("torch_leak_v25", "torch_clean_v25", limits)
    assert leak.status == "fail" and broken(leak) == {"max-peak-increase", "max-growth-per-step"}
    oom = verdict("torch_oom_v25", "torch_clean_v25", limits)
    assert oom.status == "fail" and broken(oom) == {"max-peak-increase", "max-growth-per-step",
                                                    "no-failed-allocations"}
    # the numbers the doc quotes
    increase = {o.limit: o for o in leak.outcomes}["max-peak-increase"]
    assert "(+201.9%)" in increase.message and "(+213.9%)" in {o.limit: o for o in oom.outcomes}[
        "max-peak-increase"].message
    assert "+201.9%" in DOC and "+213.9%" in DOC and "735.0\nMiB per step" in DOC
    # rank 1 of ddp_leak_v25 keeps 64 MiB a step: the table breaks it against itself
    ddp = verdict("ddp_leak_v25", "ddp_leak_v25", limits)
    assert [(o.limit, o.where) for o in ddp.broken] == [("max-growth-per-step", "process 2147 python on GPU 1")]
    # JAX under XLA's preallocation: growth is not measured, exit 2
    jax = verdict("jax_prealloc_v25", "jax_prealloc_v25", limits)
    assert jax.status == "not_measured" and [o.limit for o in jax.unmeasured] == ["max-growth-per-step"]


def test_the_cuda_table_breaks_a_leak_and_a_failed_allocation(tmp_path):
    limits = doc_limits("For a CUDA C/C++ program", tmp_path)
    known = verdict("known_mem_v25", "known_mem_v25", limits)
    kept = sum(r["bytes"] for r in truth("known_mem_v25") if r.get("freed") == 0)
    assert broken(known) == {"max-never-freed"}
    assert [o.measured for o in known.outcomes if o.limit == "max-never-freed"] == [kept]
    assert "146.0 MiB never freed" in DOC
    oom = verdict("real_oom_v25", "real_oom_v25", limits)
    assert broken(oom) == {"no-failed-allocations"}
    assert [(o.status, o.measured) for o in oom.outcomes if o.limit == "max-never-freed"] == [("held", 0)]


def test_the_jobs_run_the_script_and_name_what_the_reporter_needs():
    github = block_after("## GitHub Actions", "yaml")
    gitlab = block_after("## GitLab CI", "yaml")
    for job in (github, gitlab):
        assert "bash ci/check-gpu-memory.sh nsysan-out/run.nsys-rep" in job
        assert "-o nsysan-out/run python train.py" in job
        assert '"nsysan @ git+https://<your-forge>/<org>/nsysan@v0.1.0"' in job and "pip install nsysan\n" not in job
    assert "checks: write" in github and "report_paths: nsysan-out/junit.xml" in github
    assert "junit: nsysan-out/junit.xml" in gitlab
    # no registry host but placeholders
    assert not re.search(r"https?://(?!<)", block_after("## Install nsysan", ""))


def run_doc_line(line: str, repo: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=repo, env=env, capture_output=True, text=True, timeout=300)


def console(marker: str) -> tuple[str, str]:
    """The command and the printed lines of the console block after `marker`."""
    command, *printed = block_after(marker, "console").rstrip("\n").split("\n")
    return command.removeprefix("$ "), "\n".join(printed)


def assert_prints(command: str, expected: str, printed: str) -> None:
    """As tests/test_docs.py: NSYSAN_UPDATE_DOCS=1 writes what was printed into the doc instead."""
    if os.environ.get("NSYSAN_UPDATE_DOCS") == "1":
        path = ROOT / "docs" / "ci.md"
        old = f"```console\n$ {command}\n{expected}\n```"
        assert old in path.read_text()
        path.write_text(path.read_text().replace(old, f"```console\n$ {command}\n{printed}\n```"))
        return
    assert printed == expected


@pytest.mark.slow
def test_the_example_repository_end_to_end(tmp_path):
    repo = tmp_path / "your-project"
    (repo / "ci").mkdir(parents=True)
    (repo / ".git").mkdir()
    (repo / "pyproject.toml").write_text('[project]\nname = "your-training"\nversion = "0.1.0"\n\n'
                                         + block_after("For PyTorch", "toml"))
    script = block_after("## The check script", "bash")
    assert script.startswith("#!/usr/bin/env bash\n# ci/check-gpu-memory.sh REPORT")
    (repo / "ci" / "check-gpu-memory.sh").write_text(script)
    # the install's stand-in: `nsysan` on PATH is the nsysan under test
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "nsysan").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m nsysan "$@"\n')
    (shim / "nsysan").chmod(0o755)
    summary = tmp_path / "step-summary.md"
    env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT), COLUMNS="120",
               GITHUB_STEP_SUMMARY=str(summary))
    out = repo / "nsysan-out"
    out.mkdir()

    def capture(name: str) -> None:  # the capture's stand-in
        shutil.copyfile(FIXTURES / f"{name}.sqlite", out / "run.sqlite")

    # the baseline, from the healthy run, as the doc makes it
    capture("torch_clean_v25")
    (make,) = [line for line in block_after("## The baseline", "").splitlines() if line.startswith("nsysan ")]
    done = run_doc_line(make.replace("run.nsys-rep", "run.sqlite"), repo, env)
    assert done.returncode == 0, done.stderr
    assert (repo / "ci" / "memory-baseline.json").stat().st_size < 25_000
    # the healthy run passes
    done = run_doc_line("bash ci/check-gpu-memory.sh nsysan-out/run.sqlite", repo, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("PASS: all 3 limit checks hold")
    # the leaking run breaks it, printing what the doc prints, and leaves what the doc lists
    capture("torch_leak_v25")
    command, printed = console("## The check script")
    done = run_doc_line(command, repo, env)
    assert done.returncode == 1, done.stderr
    assert_prints(command, printed, done.stdout.rstrip("\n"))
    for name in ("junit.xml", "verdict.json", "check.md", "new-baseline.json", "report/report.html",
                 "compare/compare.html"):
        assert (out / name).is_file(), name
        assert f"`{name}`" in DOC
    # the job summary: the healthy run's verdict, then the leaking one's
    titles = [line for line in summary.read_text().splitlines() if line.startswith("### ")]
    assert [t.split(": ", 1)[0] for t in titles] == ["### ✅ nsysan check", "### ❌ nsysan check"]
    assert "PASS" in titles[0] and "all 3 limit checks hold" in titles[0]
    assert "FAIL" in titles[1] and "2 of 3 limit checks broken" in titles[1]
    # refreshing: what moved, as the doc shows it
    shutil.copyfile(out / "new-baseline.json", repo / "new-baseline.json")
    command, printed = console("## Refreshing the baseline on purpose")
    done = run_doc_line(command, repo, env)
    assert done.returncode == 0
    assert_prints(command, printed, done.stdout.rstrip("\n"))
    # no baseline: exit 2, and the JUnit file says why
    (repo / "ci" / "memory-baseline.json").unlink()
    done = run_doc_line("bash ci/check-gpu-memory.sh nsysan-out/run.sqlite", repo, env)
    assert done.returncode == 2
    (error,) = ET.parse(out / "junit.xml").getroot().iter("error")
    assert "memory-baseline.json" in error.attrib["message"]
