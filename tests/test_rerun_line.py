"""The `nsys profile` line to run instead (issue 30, section 7): built from the capture's own
traces and command line as META_DATA_CAPTURE recorded them, never with its environment."""

from __future__ import annotations

import sqlite3

from conftest import FIXTURES, analysis_of

import nsysan

from nsysan.analyses.diagnostics import rerun_command
from nsysan.sources.schema import open_readonly, probe


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


def test_nvtx_not_traced_says_so_and_ends_with_the_line_that_traces_it():
    # torch_cudaonly_v25 was captured with `-t cuda --cuda-memory-usage=true -s none`: its steps
    # are found from the kernels, and the advice adds nvtx (and the stack flags it lacked), never
    # the memory flag it used
    schema = schema_of("torch_cudaonly_v25")
    assert schema.captured_event_types == ("Cuda",)
    analysis = analysis_of("torch_cudaonly_v25")
    (said,) = [d.message for d in analysis.diagnostics if d.code == "nvtx_not_traced"]
    assert said.endswith(f"-o <report> {' '.join(recorded_command('torch_cudaonly_v25'))}")
    assert "capture again adding nvtx to -t (and --cudabacktrace=memory:1 -s process-tree): nsys profile -t cuda,nvtx " \
        in said
    assert "--cuda-memory-usage=true:" not in said and "adding --cuda-memory-usage" not in said
    # it is among the answers, beside the growth found from the kernel sequence
    answers = {a.code: a.message for a in analysis.answers}
    assert answers["nvtx_not_traced"] == said and "steps found from the kernel sequence" in answers["memory_growth"]
    # a capture that traced NVTX is not told
    assert not [d for d in analysis_of("torch_leak_v25").diagnostics if d.code == "nvtx_not_traced"]


def test_the_line_keeps_the_captures_own_options():
    # --pytorch=autograd-shapes-nvtx (torch_ops_v25: nsys records no option, the operator ranges
    # carry `sizes = `), --python-backtrace=cuda (torch_pybt_v25, torch_rank1_v25: recorded),
    # --cudabacktrace=all (known_bt_v25: stacks of every kind recorded), each once
    ops = [d.message for d in analysis_of("torch_ops_v25").diagnostics if d.code == "no_backtraces"][0]
    assert ops.endswith("-s process-tree --pytorch=autograd-shapes-nvtx -o <report> python3 "
                        "/home/user/workloads/torch_train.py --leak --steps 5")
    for name in ("torch_pybt_v25", "torch_rank1_v25"):
        line = rerun_command(schema_of(name))
        assert line.count("--python-backtrace=cuda") == 1 and "--pytorch" not in line, line
    bt = rerun_command(schema_of("known_bt_v25"))
    assert "--cudabacktrace=all:1" in bt and "memory:1" not in bt
    assert schema_of("torch_leak_v25").pytorch_nvtx == "" and "--python-backtrace" not in rerun_command(
        schema_of("torch_leak_v25"))


def test_a_capture_range_is_never_in_the_line():
    # torch_capture_range_v25 used --capture-range=cudaProfilerApi --capture-range-end=stop: the line
    # that captures from the start leaves both out, keeping the program and its warm-up argument
    (said,) = [d.message for d in analysis_of("torch_capture_range_v25").diagnostics
               if d.code == "live_at_capture_start"]
    line = said[said.index("nsys profile"):]
    assert "--capture-range" not in line and "-c " not in line and line.endswith("--profiler-warmup 3 --steps 5")
    assert "capture range from cuProfilerStart" in said


def test_a_run_cut_short_ends_with_the_line_that_keeps_a_crashs_last_events(tmp_path):
    # torch_fraction_oom_v25 ended inside 'big request', torch_oom_v25 was cut short inside
    # 'step 5 > hoard', jax_oom_v25's CUDA trace stops while its NVTX ranges go on: each may have
    # crashed, and the captures wrote their CUDA buffers only when full (CUDA_FLUSH_PERIOD 0)
    for name, code in [("torch_fraction_oom_v25", "ended_inside"), ("torch_oom_v25", "run_cut_short"),
                       ("jax_oom_v25", "cuda_trace_incomplete")]:
        analysis = analysis_of(name)
        line = analysis.capture.crash_rerun_command
        assert line.startswith("nsys profile -t cuda,nvtx ") and "--cuda-flush-interval=100 -o <report> " in line
        assert line.endswith(" ".join(recorded_command(name))), line
        (said,) = [d.message for d in analysis.diagnostics if d.code == code]
        assert said.endswith(line) and said.count("nsys profile") == 1, said
        if code != "cuda_trace_incomplete":
            assert [a.message for a in analysis.answers if a.code == code and a.topic == "oom"] == [said]
            assert "nsys profile" not in next(a.message for a in analysis.answers if a.topic == "verdict")
    ended = analysis_of("torch_fraction_oom_v25")
    assert ended.oom.ended_inside[0].message.endswith(ended.capture.crash_rerun_command)
    # a capture that already wrote its buffers at an interval is not asked for it again
    copy = tmp_path / "flushed.sqlite"
    with sqlite3.connect(FIXTURES / "torch_fraction_oom_v25.sqlite") as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
        dst.execute("UPDATE META_DATA_CAPTURE SET value = '500' WHERE name = 'PROCESS_0:CUDA_FLUSH_PERIOD'")
    line = nsysan.analyze(copy).capture.crash_rerun_command
    assert "--cuda-flush-interval" not in line and line.endswith("workloads/torch_fraction_oom.py --fraction 0.02")


def test_joining_again_says_the_line_once():
    # a finished analysis joined again (check --log on an analysis.json) keeps one line
    from nsysan.analyses.oom_ends import explain_oom

    analysis = analysis_of("torch_oom_v25")
    again = explain_oom(explain_oom(analysis))
    assert [d.message for d in again.diagnostics] == [d.message for d in analysis.diagnostics]
