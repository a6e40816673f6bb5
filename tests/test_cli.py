"""The `nsysan` command as users run it: real processes, exit codes, stdout and stderr."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nsysan", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_analyze_prints_the_summary():
    result = run("analyze", "fixtures/known_mem_v25.sqlite", "--no-progress")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "908.0 MiB" in out and "burst" in out
    assert "Never freed during the capture: 6 allocations, 146.0 MiB" in out
    assert "no_backtraces" in out
    assert result.stderr == ""


def test_analyze_json_to_stdout_is_the_document():
    result = run("analyze", "fixtures/known_mem_v25.sqlite", "--format", "json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "nsysan/analysis@1"
    assert doc["peak"]["peak_bytes"] == 952_107_008 and doc["peak"]["nvtx_range"] == "burst"
    group = next(g for g in doc["groups"] if g["kind"] == "device")
    assert {k: group[k] for k in ("never_freed_bytes", "never_freed_count")} == \
        {"never_freed_bytes": 153_067_520, "never_freed_count": 6}
    assert doc["capture"]["memory_usage_collected"] is True and doc["capture"]["backtraces"] is False


def test_several_inputs_give_one_document_each(tmp_path):
    result = run("analyze", "fixtures/known_mem_v25.sqlite", "fixtures/known_bt_v25.sqlite",
                 "--json-dir", str(tmp_path), "--format", "json")
    assert result.returncode == 0, result.stderr
    docs = json.loads(result.stdout)
    assert [d["source"]["name"] for d in docs] == ["known_mem_v25.sqlite", "known_bt_v25.sqlite"]
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["known_bt_v25.sqlite.analysis.json", "known_mem_v25.sqlite.analysis.json"]
    assert json.loads((tmp_path / "known_bt_v25.sqlite.analysis.json").read_text()) == docs[1]


def test_json_option_writes_the_file_and_keeps_the_text_summary(tmp_path):
    target = tmp_path / "sub" / "analysis.json"
    result = run("analyze", "fixtures/known_plain_v25.sqlite", "--json", str(target), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "sizes were not collected" in result.stdout
    assert "Memory API calls" in result.stdout and "cudaMalloc" in result.stdout
    assert json.loads(target.read_text())["capture"]["memory_usage_collected"] is False


def test_failed_cudamalloc_is_shown():
    result = run("analyze", "fixtures/real_oom_v25.sqlite", "--no-progress")
    assert result.returncode == 0
    assert "Failed memory calls" in result.stdout and "cudaErrorMemoryAllocation" in result.stdout


def test_a_bad_input_among_several_is_one_line_and_exit_2(tmp_path):
    bogus = tmp_path / "bogus.sqlite"
    bogus.write_bytes(b"this is not sqlite at all" * 10)
    result = run("analyze", str(bogus), "fixtures/known_mem_v25.sqlite", "--format", "json")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("nsysan: ")
    assert "Traceback" not in result.stderr
    assert [d["source"]["name"] for d in json.loads(result.stdout)] == ["known_mem_v25.sqlite"]


@pytest.mark.parametrize("args", [["analyze", "missing.sqlite"], ["analyze", "fixtures"],
                                  ["analyze", "fixtures/known_mem_v25.truth.jsonl"],
                                  ["analyze", "fixtures/known_mem_v25.sqlite", "--format", "xml"]])
def test_bad_input_is_one_clear_line(args):
    result = run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nsysan: "), result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, says", [(["analyze", "fixtures/known_mem_v25.sqlite", "--bogus"], "No such option"),
                                        (["analyze"], "Missing argument"),
                                        (["analyze", "x.sqlite", "--top", "zero"], "Invalid value")])
def test_usage_errors_are_usage_errors(args, says):
    # typer >= 0.2x vendors click: its errors are not click's, and must not read as a bug (exit 3)
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "internal error" not in result.stderr and "Traceback" not in result.stderr


def test_a_reader_that_leaves_early_is_not_an_error():
    # `nsysan analyze ... | head -3`: exit 141 as for SIGPIPE, never 1 ("a limit broke") or a traceback
    process = subprocess.Popen([sys.executable, "-m", "nsysan", "analyze", "fixtures/ddp_leak_v25.sqlite",
                                "--top", "500"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = process.stdout.readline()
    process.stdout.close()
    assert process.wait(timeout=300) == 141
    assert b"ddp_leak_v25.sqlite" in first and process.stderr.read() == b""


def test_the_input_file_is_never_modified():
    report = FIXTURES / "known_bt_v25.sqlite"
    before = (sha256(report), report.stat().st_mtime_ns)
    assert run("analyze", str(report), "--format", "json").returncode == 0
    assert (sha256(report), report.stat().st_mtime_ns) == before
    assert not list(FIXTURES.glob("*-journal")) and not list(FIXTURES.glob("*-wal"))


def test_nothing_from_the_profiled_environment_is_printed():
    # META_DATA_CAPTURE holds the profiled process's environment (PROCESS_0:ENVIRONMENT_VARIABLE):
    # the shared fixtures keep a few of the capture machine's (PATH, HOME, LD_LIBRARY_PATH...).
    import sqlite3

    conn = sqlite3.connect(f"file:{FIXTURES / 'torch_leak_v25.sqlite'}?mode=ro", uri=True)
    secrets = [v.split("=", 1)[1].strip('"') for (v,) in conn.execute(
        "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE'") if "=" in v]
    conn.close()
    assert "/opt/torch/.venv/bin:/usr/local/nvidia/bin:/usr/local/cuda/bin" in secrets[0]
    text = run("analyze", "fixtures/torch_leak_v25.sqlite", "--no-progress").stdout
    doc = run("analyze", "fixtures/torch_leak_v25.sqlite", "--format", "json").stdout
    assert "peak" in text and json.loads(doc)["peak"]["peak_bytes"] == 5682335061
    for value in secrets:
        if len(value) >= 6:  # short values such as "0,1" or "C.UTF-8" could appear by chance
            assert value not in text and value not in doc, value


def test_help_lists_analyze():
    result = run("--help")
    assert result.returncode == 0 and "analyze" in result.stdout


def test_report_goes_through_a_real_nsys_export(nsys_path, tmp_path):
    # The report alone: next to it in fixtures/ its own export would be reused when a checkout
    # happens to give the .sqlite a later mtime than the .nsys-rep.
    report = tmp_path / "in" / "known_mem_v22.nsys-rep"
    report.parent.mkdir()
    shutil.copyfile(FIXTURES / "known_mem_v22.nsys-rep", report)
    args = ["analyze", str(report), "--format", "json", "--cache-dir", str(tmp_path / "cache"),
            "--nsys", str(nsys_path)]
    first = run(*args)
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    assert doc["source"]["format"] == "nsys-rep" and doc["source"]["exported_with"] == "2022.4.2.1"
    assert doc["source"]["from_cache"] is False
    assert doc["peak"]["peak_bytes"] == 256 << 20  # the one event nsys 2022.4 kept (see fixtures/README.md)
    assert "cuda_trace_incomplete" in {d["code"] for d in doc["diagnostics"]}
    second = json.loads(run(*args).stdout)
    assert second["source"]["from_cache"] is True
    assert second["groups"] == doc["groups"]


def test_report_newer_than_nsys_is_one_clear_line(nsys_path, tmp_path):
    report = tmp_path / "known_mem_v25.nsys-rep"  # alone: no sibling export to fall back on
    shutil.copyfile(FIXTURES / "known_mem_v25.nsys-rep", report)
    result = run("analyze", str(report), "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "comes from Nsight Systems 2025.3" in line and "2022.4" in line and "--nsys" in line
