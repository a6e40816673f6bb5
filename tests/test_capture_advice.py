"""Capture advice never asks for a flag the capture already used (issue 26): META_DATA_CAPTURE
records the options, and the diagnostics ask only for the missing ones."""

from __future__ import annotations

import shutil
import sqlite3

import pytest
from conftest import FIXTURES, analysis_of

import nsysan

ADVICE_CODES = ("no_backtraces", "sizes_not_collected", "no_cuda_trace")


def advice(analysis) -> str:
    """What the advice asks for, without the whole `nsys profile` line it ends with (that line is
    the capture's own command with its flags kept: tests/test_rerun_line.py)."""
    return " ".join(d.message.split(": nsys profile ")[0] for d in analysis.diagnostics if d.code in ADVICE_CODES)


def used_flags(path) -> dict:
    """The capture's recorded options that advice is about, read with sqlite3 (never the
    environment rows)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT name, value FROM META_DATA_CAPTURE WHERE name NOT GLOB '*ENVIRONMENT*'")
        flags = {name.split(":")[-1]: value for name, value in rows}
    return {"--cuda-memory-usage=true": flags.get("COLLECT_GPU_MEMORY_USAGE") == "true",
            "--cudabacktrace": flags.get("COLLECT_MEMORY_BACKTRACES") == "true",
            "-s process-tree": flags.get("COLLECT_IP_BACKTRACE_SAMPLES") == "true"}


@pytest.mark.parametrize("name", ["known_plain_v25", "known_mem_v25", "torch_leak_v25", "jax_prealloc_v25"])
def test_advice_on_the_fixtures_asks_only_for_flags_not_used(name):
    text = advice(analysis_of(name))
    assert text  # each lacks sizes or stacks
    for flag, used in used_flags(FIXTURES / f"{name}.sqlite").items():
        if used:
            assert flag not in text, (flag, text)
    if name == "known_plain_v25":  # captured with -s none and without --cuda-memory-usage
        assert "capture again adding --cuda-memory-usage=true --cudabacktrace=memory:1 -s process-tree" in text


def _without_stacks(tmp_path, **changes):
    """known_bt_v25 (captured with --cudabacktrace=all:1 -s process-tree) with its stacks removed
    and some recorded options changed: what a capture that asked for stacks and got none holds."""
    path = tmp_path / "bt.sqlite"
    shutil.copy(FIXTURES / "known_bt_v25.sqlite", path)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM CUDA_CALLCHAINS")
        for suffix, value in changes.items():
            conn.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE name GLOB ?", (value, f"*:{suffix}"))
    return nsysan.analyze(path)


def test_stacks_asked_with_sampling_off_asks_for_sampling_alone(tmp_path):
    text = advice(_without_stacks(tmp_path, COLLECT_IP_BACKTRACE_SAMPLES="false"))
    assert "add -s process-tree" in text and "--cudabacktrace=memory:1" not in text


def test_stacks_asked_above_a_threshold_names_the_threshold(tmp_path):
    text = advice(_without_stacks(tmp_path, MEMORY_BACKTRACES_THRESHOLD_NS="80000"))
    assert "longer than 80 µs" in text and "-s process-tree" not in text


def test_stacks_asked_in_full_and_none_recorded_asks_for_nothing(tmp_path):
    text = advice(_without_stacks(tmp_path))
    assert "yet none were recorded" in text and "add " not in text


def test_the_capture_says_which_flags_it_used():
    """Capture.flags_used, from META_DATA_CAPTURE: what every piece of advice reads."""
    assert analysis_of("known_bt_v25").capture.flags_used == [
        "--cuda-memory-usage=true", "--cudabacktrace=memory", "-s process-tree"]
    assert analysis_of("torch_pybt_v25").capture.flags_used == [
        "--cuda-memory-usage=true", "--cudabacktrace=memory", "-s process-tree", "--python-backtrace=cuda"]
    assert analysis_of("known_mem_v22").capture.flags_used is None  # 2022.4 records no capture options
    for name in ("known_bt_v25", "known_mem_v25", "known_plain_v25"):
        for flag, used in used_flags(FIXTURES / f"{name}.sqlite").items():
            assert (flag.split("=")[0] in " ".join(analysis_of(name).capture.flags_used or [])) == used, (name, flag)
