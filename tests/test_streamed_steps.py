"""The streamed full analysis finds the whole frame's steps, growth verdicts, phases and step
diagnostics (the engine's StepWindows fed the streamed flow, its sites labelled by
events.flow_labels.FlowLabels), in batches of three rows and with --step-range (on shuffled rows:
test_bounded_memory's whole-document check)."""

from __future__ import annotations

import json

import pytest
from conftest import FIXTURES
from test_bounded_memory import MiB, chunk_rowids, full_documents, streaming_from

from nsysan.pipeline import stages as pipeline
from nsysan.analyses.steps import memory_threads
from nsysan.events import read, stream
from nsysan.events.stream_calls import MemoryCalls
from nsysan.render.json import render_json
from nsysan.sources.schema import open_readonly, probe

STEP_CODES = ("no_steps", "memory_growth", "memory_kept_unevenly")


def assert_steps_are_whole(whole: dict, streamed: dict) -> None:
    for section in ("steps", "growth", "phases"):
        assert streamed[section] == whole[section], section
    assert [d for d in streamed["diagnostics"] if d["code"] in STEP_CODES] == \
        [d for d in whole["diagnostics"] if d["code"] in STEP_CODES]
    assert [a for a in streamed["answers"] if a["topic"] == "growth"] == \
        [a for a in whole["answers"] if a["topic"] == "growth"]


def test_streamed_growth_of_the_leaks(monkeypatch):
    # torch_leak_v25 keeps 735 MiB a step (its truth file); ddp_leak_v25's rank 1 leaks 64 MiB a
    # step and rank 0 does not, each rank with its own steps
    path = FIXTURES / "torch_leak_v25.sqlite"
    _, streamed = full_documents(path, 3, monkeypatch)  # three memory rows a batch
    (growth,) = streamed["growth"]
    assert (growth["verdict"], growth["bytes_per_step"]) == ("growing", 735 * MiB)
    assert growth["holders"] and growth["holders"][0]["bytes"] > 0
    path = FIXTURES / "ddp_leak_v25.sqlite"
    whole, streamed = full_documents(path, 5, monkeypatch)
    assert_steps_are_whole(whole, streamed)
    ranks = {p["pid"]: p["label"] for p in streamed["capture"]["processes"]}
    assert sorted((ranks[g["pid"]], g["verdict"], g["bytes_per_step"]) for g in streamed["growth"]) == \
        [("rank 0", "stable", 0), ("rank 1", "growing", 64 * MiB)]
    assert [s["step_count"] for s in streamed["steps"]] == [len(s["steps"]) for s in streamed["steps"]] != []


def test_streamed_steps_named_by_step_range(monkeypatch):
    # --step-range names the steps (found_by "step-range"); a pattern that matches nothing
    # says so in the same warning as the whole frame's
    path = FIXTURES / "torch_leak_v25.sqlite"
    for pattern in ("step", "no such range"):
        whole = json.loads(render_json(pipeline.analyze_report(path, keep_events=True, step_range=pattern)))
        streamed = streaming_from(1, monkeypatch)
        monkeypatch.setattr(stream, "CHUNK_ROWIDS", chunk_rowids(path))
        document = json.loads(render_json(pipeline.analyze_report(path, keep_events=False, step_range=pattern)))
        assert streamed == [path]
        assert_steps_are_whole(whole, document)
        monkeypatch.undo()
    assert document["steps"] == [] and "--step-range" in \
        [d for d in document["diagnostics"] if d["code"] == "no_steps"][0]["message"]


@pytest.mark.parametrize("name", ["torch_leak_v25", "ddp_leak_v25", "torch_ops_v25"])
def test_the_scan_finds_the_memory_threads_of_the_calls(name):
    # the step ranges are searched on the threads that make memory calls: the scan's are the frame's
    conn = open_readonly(FIXTURES / f"{name}.sqlite")
    schema = probe(conn)
    calls = MemoryCalls(conn, schema)
    calls.scan()
    frame, _ = read.read_calls(conn, schema)
    assert sorted(calls.threads.tolist()) == sorted(memory_threads(frame).tolist())
    conn.close()
