"""The `nsys profile` line to run instead (issue 30, section 7): built from the capture's own
traces and command line as META_DATA_CAPTURE recorded them, never with its environment."""

from __future__ import annotations

import sqlite3

from conftest import FIXTURES, analysis_of

from nsysan.analyses.diagnostics import rerun_command
from nsysan.schema import open_readonly, probe


def schema_of(name: str):
    conn = open_readonly(FIXTURES / f"{name}.sqlite")
    try:
        return probe(conn, name)
    finally:
        conn.close()


def recorded_command(name: str) -> list[str]:
    """PROCESS_0's command and arguments, straight from the table."""
    with sqlite3.connect(f"file:{FIXTURES / name}.sqlite?mode=ro", uri=True) as conn:
        rows = dict(conn.execute("SELECT name, value FROM META_DATA_CAPTURE WHERE name = 'PROCESS_0:COMMAND' "
                                 "OR name GLOB 'PROCESS_0:ARGUMENT_*'"))
    args = sorted((int(k.rsplit("_", 1)[1]), v) for k, v in rows.items() if "ARGUMENT" in k)
    return [rows["PROCESS_0:COMMAND"]] + [v for _, v in args]


def test_the_line_is_the_captures_own_program_with_the_memory_flags():
    schema = schema_of("torch_leak_v25")
    assert list(schema.profiled_command) == recorded_command("torch_leak_v25") == [
        "python3", "/home/user/workloads/torch_train.py", "--leak", "--steps", "6"]
    assert rerun_command(schema) == ("nsys profile -t cuda,nvtx --cuda-memory-usage=true --cudabacktrace=memory:1 "
                                     "-s process-tree -o <report> python3 /home/user/workloads/torch_train.py --leak "
                                     "--steps 6")


def test_every_answer_the_flags_prevented_ends_with_it():
    # no sizes (known_plain_v25), no stacks (torch_leak_v25), a capture range (torch_capture_range_v25)
    for name, code, program in [("known_plain_v25", "sizes_not_collected", "/tmp/known"),
                                ("torch_leak_v25", "no_backtraces", "--steps 6"),
                                ("torch_capture_range_v25", "live_at_capture_start", "--profiler-warmup 3 --steps 5")]:
        (said,) = [d.message for d in analysis_of(name).diagnostics if d.code == code]
        assert said.endswith(f"-o <report> {recorded_command(name)[0]}" if name == "known_plain_v25" else program), said
        assert ": nsys profile -t cuda,nvtx " in said
    plain = [d.message for d in analysis_of("known_plain_v25").diagnostics if d.code == "sizes_not_collected"][0]
    assert "capture again adding --cuda-memory-usage=true --cudabacktrace=memory:1 -s process-tree: nsys profile" in plain


def test_a_capture_that_used_the_flags_is_not_asked_for_them():
    # known_bt_v25 was captured with --cudabacktrace=all:1 -s process-tree: no stack advice at all
    assert not [d for d in analysis_of("known_bt_v25").diagnostics if d.code == "no_backtraces"]


def test_no_environment_value_reaches_the_line():
    schema = schema_of("torch_ranks_v25")
    line = rerun_command(schema)
    with sqlite3.connect(f"file:{FIXTURES / 'torch_ranks_v25'}.sqlite?mode=ro", uri=True) as conn:
        values = [v for (v,) in conn.execute("SELECT value FROM META_DATA_CAPTURE WHERE name GLOB '*ENVIRONMENT*'")]
    assert all(str(v) not in line for v in values if v and len(str(v)) > 3)
