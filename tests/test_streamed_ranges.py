"""The streamed full analysis's NVTX sections of the timeline (streamed_full.py: its bands, trace
ends and focus, from MemoryThreads and Movement), against what the fixtures' truths say (that they
are the whole frame's, in batches and on shuffled rows, is test_bounded_memory's whole-document
check; the ranges table is one reducer on both paths: test_engine.py)."""

from __future__ import annotations

import sqlite3

from conftest import FIXTURES
from test_bounded_memory import chunk_rowids, full_documents

from nsysan.analyses.explore import FOCUS_PAD


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
