"""Steps and the growth verdict (issue 17, part 1) on the real captures, against their truths.

The torch captures' truth files hold PyTorch's own `memory_stats()` after each step. nsysan
sees the driver: its live device bytes at each step's end are the allocator's `reserved` bytes
plus the library workspaces cuBLAS and friends allocate outside the allocator, which are
2 x (64 MiB + 128 KiB + 1 KiB) per process on these captures (issue 17, part 3).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys

import pytest

from conftest import ROOT, analysis_of, truth
from nsysan.analyses.growth import judge_all, judge_growth
from nsysan.model import Analysis, MemoryCap, Step, StepSeries

MiB = 1 << 20
OUTSIDE_ALLOCATOR = 2 * (64 * MiB + 128 * 1024 + 1024)


def steps_of(analysis: Analysis, pid: int | None = None) -> StepSeries:
    found = [s for s in analysis.steps if pid is None or s.pid == pid]
    assert len(found) == 1, [(s.pid, s.device) for s in analysis.steps]
    return found[0]


def growth_of(analysis: Analysis, pid: int | None = None):
    found = [g for g in analysis.growth if pid is None or g.pid == pid]
    assert len(found) == 1
    return found[0]


def truth_reserved(name: str) -> list[int]:
    return [r["reserved"] for r in truth(name) if "step" in r]


@pytest.mark.parametrize("name", ["torch_leak_v25", "torch_clean_v25", "torch_expandable_v25"])
def test_live_bytes_at_each_step_end_are_reserved_plus_the_workspaces(name):
    series = steps_of(analysis_of(name))
    assert [s.name for s in series.steps] == [f"step {k}" for k in range(6)]
    assert [s.end_live_bytes for s in series.steps] == [r + OUTSIDE_ALLOCATOR for r in truth_reserved(name)]
    # the delta of step k is the end of step k minus the end of step k-1
    reserved = truth_reserved(name)
    assert [s.delta_bytes for s in series.steps[1:]] == [b - a for a, b in zip(reserved, reserved[1:])]


@pytest.mark.parametrize("name", ["torch_leak_v25", "torch_expandable_v25"])
def test_a_leaking_run_grows_by_the_median_delta(name):
    analysis = analysis_of(name)
    reserved = truth_reserved(name)
    deltas = [b - a for a, b in zip(reserved, reserved[1:])]  # steps 1-5
    growth = growth_of(analysis)
    assert growth.verdict == "growing"
    assert abs(growth.bytes_per_step - statistics.median(deltas)) <= 0.02 * statistics.median(deltas)
    # step 0 and step 1 (944 / 900 MiB: the cache still warming) are left out
    assert (growth.first_step, growth.last_step) == (2, 5)
    assert growth.growing_steps == [2, 3, 4, 5]
    assert growth.message.startswith(f"process {analysis.capture.processes[0].pid} on GPU 0 grows ")
    # (139.8 GiB - live at the end of step 5) / the rate, counted on from step 5
    gpu = analysis.capture.gpus[0].total_memory_bytes
    expected = 5 + -(-(gpu - (reserved[5] + OUTSIDE_ALLOCATOR)) // growth.bytes_per_step)
    assert growth.capacity_step == expected
    assert f"reached at step ~{expected}" in growth.message
    assert [d.code for d in analysis.diagnostics].count("memory_growth") == 1


def test_a_leaking_run_names_what_keeps_the_memory(torch_leak_v25):
    holders = growth_of(torch_leak_v25).holders
    # the retained graph: activations from forward, gradients from backward (autograd thread)
    assert {h.nvtx_range for h in holders[:2]} == {"forward", "backward"}
    kept = sum(s.kept_bytes for s in steps_of(torch_leak_v25).steps if s.number >= 2)
    assert sum(h.bytes for h in holders) == kept


def test_a_clean_run_is_stable_from_step_3_without_a_warning():
    analysis = analysis_of("torch_clean_v25")
    growth = growth_of(analysis)
    assert growth.verdict == "stable"
    assert growth.first_step == 3  # steps 1 and 2 still warm the cache (+128, +134 MiB)
    # it grew while the cache warmed, then stayed flat: said as such, not as a leak
    assert growth.message.endswith("grew during steps 0-2 (+1.7 GiB), flat since step 2: nothing allocated or freed in "
                                   "steps 3-5")
    assert not [d for d in analysis.diagnostics if d.code.startswith("memory_")]
    assert [v.code for v in analysis.answers if v.topic == "growth"] == ["growth_stable"]


def test_ddp_rank_1_grows_64_mib_per_step_rank_0_is_stable(ddp_leak_v25):
    # ddp_train.py: rank 1 (process 2147, GPU 1) keeps a 64 MiB tensor every step; rank 0 keeps none
    leaking, steady = growth_of(ddp_leak_v25, 2147), growth_of(ddp_leak_v25, 2146)
    assert (leaking.verdict, leaking.gpu, leaking.bytes_per_step) == ("growing", 1, 64 * MiB)
    assert (leaking.first_step, leaking.last_step) == (2, 7)
    assert [s.delta_bytes for s in steps_of(ddp_leak_v25, 2147).steps[2:]] == [64 * MiB] * 6
    assert [s.kept_bytes for s in steps_of(ddp_leak_v25, 2147).steps[2:]] == [64 * MiB] * 6
    assert steady.verdict == "stable" and steady.gpu == 0
    assert [s.delta_bytes for s in steps_of(ddp_leak_v25, 2146).steps[1:]] == [0] * 7
    # processes are named by rank (here: by GPU order), and the odd one out comes first
    assert leaking.message.startswith("rank 1 (process 2147) on GPU 1 grows 64.0 MiB per step")
    # rank 1 departs at step 1 (step 0 is warm-up for both): +196 MiB where rank 0 added nothing
    assert (leaking.departure_step, leaking.departure_bytes, leaking.others_bytes) == \
        (1, steps_of(ddp_leak_v25, 2147).steps[1].delta_bytes, 0)
    assert steps_of(ddp_leak_v25, 2147).steps[1].delta_bytes == 196 * MiB
    assert steady.departure_step is None
    fleet = [v.message for v in ddp_leak_v25.answers if v.code == "growth_by_process"]
    assert fleet == ["rank 1 departs first, at step 1: +196.0 MiB where the others added at most 0 B, kept by "
                     "cudaMalloc in step N [pt_autograd_1]; rank 1 grows 64.0 MiB/step; rank 0 is stable"]


def test_known_mem_keeps_4_mib_in_steps_2_5_and_8(known_mem_v25):
    # known_allocs.cu: train_step keeps a cache entry when step % 3 == 2, the truth's three
    # never-freed alloc_cache_entry blocks; every other allocation of a step is freed in it
    cache_entries = [r["bytes"] for r in truth("known_mem_v25") if r.get("site") == "alloc_cache_entry"
                     and r["freed"] == 0]
    kept = {k: b for k, b in zip((2, 5, 8), cache_entries)}
    series = steps_of(known_mem_v25)
    assert [s.kept_bytes for s in series.steps] == [kept.get(k, 0) for k in range(9)]
    assert [s.delta_bytes for s in series.steps] == [kept.get(k, 0) for k in range(9)]
    growth = growth_of(known_mem_v25)
    assert growth.verdict == "uneven" and growth.growing_steps == [2, 5, 8]
    assert growth.total_bytes == sum(cache_entries)
    assert "steps 2, 5 and 8 (4.0 MiB each)" in growth.message


def test_a_trace_that_stops_before_the_steps_judges_nothing(known_mem_v22):
    # nsys 2022.4 lost the CUDA trace of this capture before its steps began
    growth = growth_of(known_mem_v22)
    assert growth.verdict == "too_few_steps"
    assert not any(s.traced for s in steps_of(known_mem_v22).steps)
    assert "the CUDA trace stops before" in growth.message


def test_the_steps_of_a_run_cut_short_leave_out_the_open_one():
    # torch_oom_v25 ends in step 5, which never closes (the OOM)
    series = steps_of(analysis_of("torch_oom_v25"))
    assert [s.closed for s in series.steps] == [True] * 5 + [False]
    assert growth_of(analysis_of("torch_oom_v25")).last_step == 4


def test_no_steps_says_how_to_mark_them(real_oom_v25):
    assert real_oom_v25.steps == [] and real_oom_v25.growth == []
    [note] = [d for d in real_oom_v25.diagnostics if d.code == "no_steps"]
    assert "torch.cuda.nvtx.range_push(f\"step {i}\")" in note.message
    assert "torch.cuda.nvtx.range_pop()" in note.message


def test_step_range_names_the_steps():
    import nsysan

    analysis = nsysan.analyze(ROOT / "fixtures" / "known_mem_v25.sqlite", step_range=r"^step [0-8]$")
    series = steps_of(analysis)
    assert series.found_by == "step-range" and len(series.steps) == 9
    unmatched = nsysan.analyze(ROOT / "fixtures" / "known_mem_v25.sqlite", step_range="^no such range$")
    assert unmatched.steps == [] and [d.severity for d in unmatched.diagnostics if d.code == "no_steps"] == ["warning"]


def test_a_bad_step_range_is_one_line_and_exit_2():
    done = subprocess.run([sys.executable, "-m", "nsysan", "analyze", "fixtures/known_mem_v25.sqlite",
                           "--step-range", "step ("], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--step-range 'step (' is not a regular expression" in done.stderr


# --- the rule on hand-made steps ------------------------------------------------------------

def series_of(ends_mib: list[float], start_mib: float = 100, pid: int = 7, gpu: int = 0) -> StepSeries:
    """Steps whose live bytes end at the given MiB, each starting where the previous ended (5 ns each)."""
    steps, before = [], int(start_mib * MiB)
    for k, end in enumerate(ends_mib):
        end_bytes = int(end * MiB)
        steps.append(Step(number=k, name=f"step {k}", start_ns=k * 10, end_ns=k * 10 + 5, closed=True,
                          start_live_bytes=before, end_live_bytes=end_bytes, delta_bytes=end_bytes - before,
                          peak_live_bytes=max(before, end_bytes), allocated_bytes=0, freed_bytes=0, kept_bytes=0))
        before = end_bytes
    return StepSeries(pid=pid, device=gpu, gpu=gpu, range_name="step N", found_by="nvtx", steps=steps)


def test_three_growing_steps_in_a_row_are_growth():
    growth = judge_growth(series_of([200, 210, 220, 230]))
    assert growth.verdict == "growing" and growth.bytes_per_step == 10 * MiB and growth.capacity_step is None


def test_the_projection_runs_into_the_tightest_cap():
    cap = MemoryCap(pid=7, device=0, gpu=0, cap_bytes=1024 * MiB, source="allocator_oom")
    growth = judge_growth(series_of([200, 210, 220, 230]), cap, "rank 3")
    # 230 MiB live after step 3, 10 MiB per step: 1024 MiB after 80 more steps (79.4 rounded up)
    assert growth.capacity_step == 3 + 80 and growth.capacity_source == "allocator_oom"
    assert growth.message.startswith("rank 3 (process 7) on GPU 0 grows 10.0 MiB per step")
    assert "the 1.0 GiB at which the allocator gave up is reached at step ~83, in about 400 ns more at the " \
        "median step time of 5 ns" in growth.message
    assert (growth.capacity_time_ns, growth.step_time_ns) == (80 * 5, 5)


def test_the_projection_leaves_room_for_the_other_processes_on_the_gpu():
    gpu = MemoryCap(pid=7, device=0, gpu=0, cap_bytes=1024 * MiB, source="gpu_total")
    other = series_of([300, 300, 300, 300], start_mib=300, pid=8)
    leaking = series_of([200, 210, 220, 230])
    mine = judge_all([leaking, other], [], [gpu])[0]
    # 1024 - 300 held by process 8 - 230 live = 494 MiB at 10 MiB per step: 50 more steps
    assert mine.capacity_step == 3 + 50 and "less the 300.0 MiB other processes hold on that GPU" in mine.message


def test_the_first_process_to_depart_is_named_at_its_first_departing_step():
    steady = series_of([100, 100, 100, 100, 100, 100], pid=1, gpu=0)
    late = series_of([100, 100, 100, 164, 228, 292], pid=2, gpu=1)  # departs at step 3
    later = series_of([100, 100, 100, 100, 132, 164], pid=3, gpu=2)  # only from step 4, less
    growth = judge_all([steady, late, later], [], [])
    assert [(g.pid, g.departure_step, g.departure_bytes, g.others_bytes) for g in growth] == \
        [(1, None, None, None), (2, 3, 64 * MiB, 0), (3, None, None, None)]
    # a stable process's rise is no departure
    bump = series_of([100, 150, 150, 150, 150, 150], pid=4, gpu=3)  # its warm-up: judged stable
    assert all(g.departure_step is None for g in judge_all([steady, bump], [], []))


def test_two_growing_steps_are_not_enough():
    assert judge_growth(series_of([200, 210, 220, 220, 220])).verdict == "uneven"


def test_growth_below_one_percent_of_live_bytes_is_noise():
    # 10 GiB live, +50 MiB per step: under 1% (102 MiB) each, 150 MiB together, above the threshold
    growth = judge_growth(series_of([10240, 10290, 10340, 10390], start_mib=10240))
    assert growth.verdict == "uneven"
    assert judge_growth(series_of([10240, 10240.5, 10240, 10240.5], start_mib=10240)).verdict == "stable"


def test_warm_up_steps_are_left_out():
    growth = judge_growth(series_of([1000, 1500, 1500, 1500, 1500]))
    assert (growth.verdict, growth.first_step) == ("stable", 2)


def test_too_few_steps():
    assert judge_growth(series_of([200, 300, 400])).verdict == "too_few_steps"


def test_old_documents_without_steps_still_load(known_mem_v25):
    data = known_mem_v25.to_dict()
    for key in ("steps", "growth", "answers"):
        data.pop(key)
    for peak in data["peaks"]:
        peak.pop("made_of")
    loaded = Analysis.from_dict(data)
    assert loaded.steps == [] and loaded.growth == [] and loaded.answers == []
    assert Analysis.from_dict(known_mem_v25.to_dict()).steps == known_mem_v25.steps


# --- the terminal answers first --------------------------------------------------------------

def summary(name: str, *options: str) -> str:
    done = subprocess.run([sys.executable, "-m", "nsysan", "analyze", f"fixtures/{name}.sqlite", *options],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_answers_come_right_after_the_capture_box():
    lines = summary("torch_leak_v25").splitlines()
    box_end = next(i for i, line in enumerate(lines) if line.startswith("╰"))
    assert lines[box_end + 1] == "Answers"
    answers = "\n".join(lines[box_end + 1:box_end + 12])
    # one label column, as wide as its longest label
    assert re.search(r"^ verdict +grows 735.0 MiB per step", answers, re.M)
    assert re.search(r"^ peak +5.3 GiB on GPU 0", answers, re.M)
    assert re.search(r"^ growth +process 1644 on GPU 0 grows 735.0 MiB per step", answers, re.M)
    text = "\n".join(lines)
    assert text.index("grows 735.0 MiB") < text.index("Peak GPU memory") < text.index("Steps of process 1644")


def test_warnings_about_the_numbers_come_before_the_tables():
    text = summary("known_mem_v22")
    assert text.index("the CUDA trace stops at 493.3 ms") < text.index("Peak GPU memory")
    assert text.count("the CUDA trace stops at 493.3 ms") == 1  # not again among the diagnostics


def test_no_trailing_spaces_and_one_time_unit_per_column():
    text = summary("torch_leak_v25")
    assert not [line for line in text.splitlines() if line.endswith(" ")]
    # "allocated at" of the never-freed table spans 9.8 s to 10.1 s: all in seconds
    never_freed = text[text.index("Never freed during the capture"):text.index("Top allocation sites")]
    rows = [line for line in never_freed.splitlines() if re.search(r"MiB +device", line)]
    assert rows and all(line.endswith(" s") for line in rows)


def test_one_failed_call_is_singular(real_oom_v25):
    [failed] = [d for d in real_oom_v25.diagnostics if d.code == "allocation_failed"]
    assert failed.message.startswith("1 memory call failed")


def test_version():
    import nsysan

    done = subprocess.run([sys.executable, "-m", "nsysan", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert (done.returncode, done.stdout) == (0, f"nsysan {nsysan.__version__}\n")


def test_a_long_run_lists_its_first_and_last_steps():
    from nsysan.analyses.steps import listed

    series = series_of([100 + k for k in range(500)])
    shown = listed(series)
    assert shown.step_count == 500 and len(shown.steps) == 200
    assert [s.number for s in shown.steps] == list(range(100)) + list(range(400, 500))
    assert listed(series_of([1, 2, 3])).step_count == 3


def test_steps_inside_an_xla_preallocation_are_not_called_stable():
    # jax_prealloc_v25: XLA reserved 104.9 GiB at start and allocates inside it, while its own
    # bytes_in_use grows by 512 MiB a step (truth): flat steps in the trace are no all-clear
    in_use = [r["bytes_in_use"] for r in truth("jax_prealloc_v25") if "step" in r]
    assert {b - a for a, b in zip(in_use, in_use[1:])} == {512 * MiB}
    analysis = analysis_of("jax_prealloc_v25")
    [growth] = analysis.growth
    assert growth.verdict == "preallocated" and growth.capacity_source == "xla_preallocation"
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in growth.message
    assert not [d for d in analysis.diagnostics if d.code in ("memory_growth", "memory_kept_unevenly")]


def test_the_answers_come_in_order(ddp_leak_v25):
    topics = [a.topic for a in ddp_leak_v25.answers]
    assert topics == sorted(topics, key=["verdict", "peak", "growth", "oom", "reserved", "trust"].index)
    assert topics[0] == "verdict" and topics.count("verdict") == 1
    # each process's peak, named by rank, with what made it
    peaks = [a.message for a in ddp_leak_v25.answers if a.topic == "peak"]
    assert peaks[0].startswith("1.6 GiB on GPU 1 (1.2% of 139.8 GiB), rank 1 (process 2147)")
    assert "; made of " in peaks[0]
    made_of = ddp_leak_v25.process_peaks()[0].made_of
    assert made_of == sorted(made_of, key=lambda h: -h.bytes)
