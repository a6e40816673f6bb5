"""The streamed full analysis's NVTX sections (analyses/streamed_ranges.py): the ranges table and
the timeline's bands, spans, trace ends and focus, against what the fixtures' truths say (that
they are the whole frame's, in batches and on shuffled rows, is test_bounded_memory's whole-document
check)."""

from __future__ import annotations

import sqlite3

from conftest import FIXTURES
from test_bounded_memory import chunk_rowids, full_documents

from nsysan.analyses.explore import FOCUS_PAD

MiB = 1 << 20


def test_streamed_ranges_of_a_leaking_rank(monkeypatch):
    # ddp_train.py: two ranks run "step 0".."step 7", and rank 1 keeps a new 64 MiB tensor in each
    # step; from step 2 on the caching allocator holds nothing spare, so each step makes exactly
    # that one cudaMalloc, never freed, and the process's highest live bytes rise by 64 MiB a step
    path = FIXTURES / "ddp_leak_v25.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    rows = {r["name"]: r for r in streamed["ranges"]}
    steps = [rows[f"step {k}"] for k in range(2, 8)]
    assert [(r["instances"], r["allocations"], r["allocated_bytes"], r["still_live_bytes"], r["freed_bytes"])
            for r in steps] == [(2, 1, 64 * MiB, 64 * MiB, 0)] * 6
    assert [b["max_live_bytes"] - a["max_live_bytes"] for a, b in zip(steps, steps[1:])] == [64 * MiB] * 5


def test_streamed_operator_ranges(monkeypatch):
    # --pytorch=autograd-shapes-nvtx: every ATen operator is a push/pop range of its own; the table
    # lists every name (fewer than 200), so its instances add up to the export's push/pop ranges
    path = FIXTURES / "torch_ops_v25.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    with sqlite3.connect(path) as conn:
        pushed = conn.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()[0]
    assert sum(r["instances"] for r in streamed["ranges"]) == pushed
    operators = {r["name"]: r for r in streamed["ranges"] if r["operator"]}
    assert "aten::addmm" in operators and operators["aten::addmm"]["allocated_bytes"] > 0
    user = {r["name"] for r in streamed["ranges"] if not r["operator"]}
    assert {"setup", "forward", "backward"} <= user


def streamed_steps(name: str, monkeypatch) -> tuple[dict, list[dict]]:
    """The streamed document's timeline of fixture `name`, and its step bands."""
    path = FIXTURES / f"{name}.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    timeline = streamed["timeline"]
    return timeline, [b for b in timeline["bands"] if b["name"].startswith("step ")]


def focus_of(start: int, end: int) -> tuple[int, int]:
    """The focus of the span from `start` to `end`: padded by FOCUS_PAD of it on each side."""
    pad = int(FOCUS_PAD * (end - start))
    return start - pad, end + pad


def test_streamed_focus_is_on_the_steps_after_the_warm_up(monkeypatch):
    # torch_train.py --steps 6: "setup", then "step 0".."step 5" on the main thread; the memory
    # moves in the steps, so the page opens on them; step 0 (488 ms: cuDNN and the caching
    # allocator set up) outlasts steps 1-5 together (101 ms), so it is left out as warm-up, as the
    # growth verdict leaves it out
    timeline, steps = streamed_steps("torch_leak_v25", monkeypatch)
    assert [b["name"] for b in timeline["bands"]] == ["setup"] + [f"step {k}" for k in range(6)]
    lengths = [b["end_ns"] - b["start_ns"] for b in steps]
    assert lengths[0] > sum(lengths[1:])
    assert (timeline["focus_start_ns"], timeline["focus_end_ns"]) == focus_of(steps[0]["end_ns"], steps[-1]["end_ns"])


def test_streamed_focus_after_the_warm_up_of_every_rank(monkeypatch):
    # ddp_train.py: two ranks, "step 0" (328 and 332 ms) then steps 1-7 (2-7 ms each); the page
    # opens where the later rank's warm-up ends, widened to the start of the step it cuts (rank 0's
    # step 2), so the steady steps fill it instead of 10% of it
    timeline, steps = streamed_steps("ddp_leak_v25", monkeypatch)
    warm_up_end = max(b["end_ns"] for b in steps if b["name"] == "step 0")
    cut = [b for b in steps if b["start_ns"] < warm_up_end < b["end_ns"]]
    assert [b["name"] for b in cut] == ["step 2"]
    assert (timeline["focus_start_ns"], timeline["focus_end_ns"]) == \
        focus_of(cut[0]["start_ns"], max(b["end_ns"] for b in steps))


def test_streamed_focus_keeps_a_warm_up_that_does_not_dominate(monkeypatch):
    # torch_oom_v25: step 5 runs out of memory and is the longest (1.18 s against step 0's 0.43 s):
    # every step stays in the view
    timeline, steps = streamed_steps("torch_oom_v25", monkeypatch)
    assert (timeline["focus_start_ns"], timeline["focus_end_ns"]) == \
        focus_of(min(b["start_ns"] for b in steps), max(b["end_ns"] for b in steps))


def test_streamed_trace_end(monkeypatch):
    # known_mem_v22: nsys 2022.4 traced the CUDA 13 program only partly, its NVTX ranges go on
    # after the last CUDA call it recorded
    path = FIXTURES / "known_mem_v22.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    with sqlite3.connect(path) as conn:
        last_call = conn.execute('SELECT max("end") FROM CUPTI_ACTIVITY_KIND_RUNTIME').fetchone()[0]
    assert [(e["pid"], e["time_ns"]) for e in streamed["timeline"]["trace_ends"]] == \
        [(streamed["capture"]["processes"][0]["pid"], last_call)]
