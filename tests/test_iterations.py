"""Steps without NVTX (analyses/iterations.py): real captures of scripts without NVTX get their
steps from the kernel sequence, with the live bytes at each step's end the truth's `reserved`
plus the library workspaces (as test_growth.py checks for NVTX steps); and captures whose NVTX
ranges are removed find the steps the ranges marked, with the same verdict."""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path

import pytest

import nsysan
from conftest import FIXTURES, analysis_of, truth
from nsysan.analyses.iterations import find_iterations
from test_bounded_memory import assert_streamed_full_is_whole, chunk_rowids, full_documents

MiB = 1 << 20
OUTSIDE_ALLOCATOR = 2 * (64 * MiB + 128 * 1024 + 1024)  # test_growth.py: cuBLAS's workspaces
EVAL_WORKSPACE = OUTSIDE_ALLOCATOR // 2  # an evaluation runs no backward pass: one thread's workspace


def reserved_after_steps(name: str) -> list[int]:
    """The truth's `reserved` after each step (the lines of steps, not of setup or events)."""
    lines = [json.loads(line) for line in (FIXTURES / f"{name}.truth.jsonl").read_text().splitlines()]
    return [t["reserved"] for t in lines if isinstance(t.get("step"), int) and t["step"] >= 0 and "event" not in t]


def test_an_evaluation_leak_without_nvtx_grows_every_step():
    # gpt2_steps.py --mode eval-leak: no torch.no_grad(), loss summed without .item(), no NVTX at all
    analysis = analysis_of("torch_nonvtx_leak_v25")
    series, = analysis.steps
    assert (series.found_by, series.confidence, len(series.steps)) == ("kernels", "high", 8)
    reserved = reserved_after_steps("torch_nonvtx_leak_v25")
    assert [s.end_live_bytes for s in series.steps] == [r + EVAL_WORKSPACE for r in reserved]
    growth, = analysis.growth
    deltas = [b - a for a, b in zip(reserved, reserved[1:])]
    assert (growth.verdict, growth.first_step, growth.bytes_per_step) == \
        ("growing", 2, int(statistics.median(deltas[1:])))
    assert growth.message.endswith("steps found from the kernel sequence: 8 iterations of 128 kernels, the same in 8 "
                                   "of 8 (confidence high)")
    assert "memory_growth" in [d.code for d in analysis.diagnostics]


def test_a_sequence_length_warm_up_without_nvtx_is_no_leak():
    # gpt2_steps.py --seq-warmup 4: the sequence grows for steps 0-3, then stays; reserved with it
    analysis = analysis_of("torch_nonvtx_warmup_v25")
    series, = analysis.steps
    assert (series.found_by, len(series.steps)) == ("kernels", 10)
    reserved = reserved_after_steps("torch_nonvtx_warmup_v25")
    assert [s.end_live_bytes for s in series.steps] == [r + OUTSIDE_ALLOCATOR for r in reserved]
    growth, = analysis.growth
    assert growth.verdict == "stable"
    assert growth.message.startswith("process 627 on GPU 0 grew during steps 0-3 (+4.1 GiB), flat since step 3: "
                                     "nothing allocated or freed in steps 4-9; steps found from the kernel sequence")
    assert not [d for d in analysis.diagnostics if d.code.startswith("memory_")]


def test_empty_cache_mid_run_is_a_refill_not_a_leak():
    # gpt2_steps.py --empty-cache-after 3: the cache is given back after step 3 and filled again
    analysis = analysis_of("torch_emptycache_v25")
    series, = analysis.steps
    lines = [json.loads(line) for line in (FIXTURES / "torch_emptycache_v25.truth.jsonl").read_text().splitlines()]
    emptied, = [t["reserved"] for t in lines if t.get("event") == "after_empty_cache"]
    reserved = reserved_after_steps("torch_emptycache_v25")
    reserved[3] = emptied  # the kernel steps end at the next step's first launch: after empty_cache()
    assert [s.end_live_bytes for s in series.steps] == [r + OUTSIDE_ALLOCATOR for r in reserved]
    growth, = analysis.growth
    assert growth.verdict == "stable"
    assert growth.message.startswith("process 632 on GPU 0 gave 2.2 GiB back in step 3 (torch.cuda.empty_cache() or the "
                                     "allocator releasing its cache), took 2.5 GiB again in steps 4-5 and is flat "
                                     "since step 5")
    assert not [d for d in analysis.diagnostics if d.code.startswith("memory_")]


def without_nvtx(name: str, folder: Path) -> Path:
    """A copy of the fixture with no NVTX event left, as a script without NVTX ranges is captured."""
    out = folder / f"{name}_nonvtx.sqlite"
    with sqlite3.connect(FIXTURES / f"{name}.sqlite") as source, sqlite3.connect(out) as copy:
        source.backup(copy)
        copy.execute("DELETE FROM NVTX_EVENTS")
    return out


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("nonvtx")
    return {name: nsysan.analyze(without_nvtx(name, folder))
            for name in ("torch_leak_v25", "ddp_leak_v25", "torch_oom_v25")}


def test_kernel_steps_of_torch_leak_are_its_nvtx_steps(bare):
    series, = bare["torch_leak_v25"].steps
    marked, = analysis_of("torch_leak_v25").steps
    assert (series.found_by, series.range_name, series.confidence) == ("kernels", "iteration N", "high")
    assert series.found_how == ("steps found from the kernel sequence: 6 iterations of 306 kernels, the same in 5 of 6 "
                                "(confidence high)")
    assert [s.name for s in series.steps] == [f"iteration {i}" for i in range(6)]
    reserved = [r["reserved"] for r in truth("torch_leak_v25") if "step" in r]
    assert [s.end_live_bytes for s in series.steps] == [r + OUTSIDE_ALLOCATOR for r in reserved]
    assert [s.end_live_bytes for s in series.steps] == [s.end_live_bytes for s in marked.steps]
    # each begins within a millisecond of its NVTX range (after step 0, which follows the setup)
    assert all(abs(k.start_ns - n.start_ns) < 1_000_000 for k, n in zip(series.steps[1:], marked.steps[1:]))


def test_a_leak_without_nvtx_gets_the_growth_verdict_and_says_how(bare):
    growth, = bare["torch_leak_v25"].growth
    marked, = analysis_of("torch_leak_v25").growth
    assert (growth.verdict, growth.bytes_per_step) == ("growing", marked.bytes_per_step) == ("growing", 735 * MiB)
    assert growth.message.endswith("; steps found from the kernel sequence: 6 iterations of 306 kernels, the same in "
                                   "5 of 6 (confidence high)")
    answer, = [a for a in bare["torch_leak_v25"].answers if a.topic == "growth"]
    assert "steps found from the kernel sequence" in answer.message


def test_ddp_without_nvtx_finds_rank_1s_leak_and_rank_0_stable(bare):
    verdicts = {g.process: (g.verdict, g.bytes_per_step) for g in bare["ddp_leak_v25"].growth}
    assert verdicts["rank 1"] == ("growing", 64 * MiB)
    assert verdicts["rank 0"][0] == "stable"
    assert {s.found_by for s in bare["ddp_leak_v25"].steps} == {"kernels"}


def test_the_step_an_oom_ends_in_is_open_and_the_others_grow(bare):
    series, = bare["torch_oom_v25"].steps
    assert [s.closed for s in series.steps] == [True] * 5 + [False]
    growth, = bare["torch_oom_v25"].growth
    marked, = analysis_of("torch_oom_v25").growth
    assert (growth.verdict, growth.bytes_per_step) == ("growing", marked.bytes_per_step)


def test_nvtx_steps_and_step_range_keep_priority(tmp_path):
    assert analysis_of("torch_leak_v25").steps[0].found_by == "nvtx"
    named = nsysan.analyze(without_nvtx("torch_leak_v25", tmp_path), step_range="no such range")
    assert named.steps == [] and [d.code for d in named.diagnostics if d.code == "no_steps"] == ["no_steps"]


@pytest.mark.parametrize("name", ["torch_nonvtx_leak_v25", "torch_nonvtx_warmup_v25", "torch_emptycache_v25"])
def test_streamed_kernel_steps_are_the_whole_frame_ones(name, monkeypatch):
    path = FIXTURES / f"{name}.sqlite"
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert whole["steps"][0]["found_by"] == "kernels"
    assert_streamed_full_is_whole(whole, streamed)


def test_a_step_whose_first_launches_are_swapped_is_still_a_step():
    # two threads' launches can come in another order in one step: its beginning then differs
    from nsysan.events.read_launches import read_launches
    from nsysan.sources.schema import open_readonly, probe

    path = FIXTURES / "torch_nonvtx_leak_v25.sqlite"
    conn = open_readonly(path, name=path.name)
    try:
        launches, names = read_launches(conn, probe(conn, path.name), [626])
    finally:
        conn.close()
    found = find_iterations(launches, names, [626])[626]
    first = launches["ts_ns"].searchsorted(found.spans["start_ns"].to_numpy())
    tokens = launches["token"].to_numpy().copy()
    for step in (0, 4, 7):  # the first, one inside, the last
        at = first[step]
        tokens[at], tokens[at + 1] = tokens[at + 1], tokens[at]
    again = find_iterations(launches.assign(token=tokens), names, [626])[626]
    assert again.spans["start_ns"].tolist() == found.spans["start_ns"].tolist()
    assert (again.same, again.confidence) == (5, "medium")


def test_phases_of_kernel_steps_are_the_nvtx_phases(bare):
    # the autograd thread's launches tell the backward pass apart, the optimizer's kernels what follows
    def costs(analysis, family):
        return {p.path.split(" > ")[-1]: (p.instances, p.start_live_median_bytes, p.rise_median_bytes,
                                          p.rise_max_bytes, p.net_median_bytes, p.net_min_bytes, p.net_max_bytes)
                for p in analysis.phases if p.path.startswith(f"{family} > ")}

    inferred = costs(bare["torch_leak_v25"], "iteration N")
    assert set(inferred) == {"forward", "backward", "optimizer"}
    assert inferred == costs(analysis_of("torch_leak_v25"), "step N")
    # an evaluation launches from one thread: no phase can be told apart
    assert not [p for p in analysis_of("torch_nonvtx_leak_v25").phases if " > " in p.path]


def test_library_ranges_of_a_script_without_nvtx_are_not_its_steps(tmp_path):
    # `nsys -t cuda,nvtx` of a script that marks nothing still records CCCL's cub:: ranges, one
    # of each per step on the autograd thread: they are no steps, the kernels give them
    out = tmp_path / "torch_leak_cccl_only.sqlite"
    with sqlite3.connect(FIXTURES / "torch_leak_v25.sqlite") as source, sqlite3.connect(out) as copy:
        source.backup(copy)
        copy.execute("DELETE FROM NVTX_EVENTS WHERE domainId = 0")  # the script's own ranges
        assert copy.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()[0] == 18
    analysis = nsysan.analyze(out)
    series, = analysis.steps
    assert (series.found_by, len(series.steps)) == ("kernels", 6)
    growth, = analysis.growth
    assert (growth.verdict, growth.bytes_per_step) == ("growing", 735 * MiB)
