"""Processes named by rank, and the caps on what each may hold (issue 17, section 4)."""

from __future__ import annotations

import sqlite3

from conftest import FIXTURES, analysis_of

import nsysan
from nsysan.analyses.ranks import assign_ranks
from nsysan.model import GroupSummary, Process
from nsysan.render.json import render_json
from nsysan.sources.schema import probe


def _group(pid: int, device: int, kind: str = "device", allocations: int = 1) -> GroupSummary:
    return GroupSummary(pid=pid, device=device, kind=kind, gpu=device, peak_bytes=1, peak_time_ns=0, end_bytes=0,
                        allocations=allocations, frees=0, allocated_bytes=1, never_freed_bytes=0,
                        never_freed_count=0, frees_without_alloc=0, frees_without_alloc_bytes=0)


def test_ddp_ranks_follow_gpu_order(ddp_leak_v25):
    # ddp_train.py: rank = GPU (torch.cuda.set_device(rank)); process 2146 computes on GPU 0,
    # 2147 on GPU 1. nsys recorded torchrun's environment only, which has no RANK.
    by_pid = {p.pid: p for p in ddp_leak_v25.capture.processes}
    assert (by_pid[2146].rank, by_pid[2147].rank) == (0, 1)
    assert {p.rank_source for p in by_pid.values()} == {"gpu order"}
    assert ddp_leak_v25.process_label(2147) == "rank 1"
    assert ddp_leak_v25.process_label(None) == "all processes"


def test_static_only_device_is_not_a_peak_row(ddp_leak_v25):
    # Rank 1 (2147) opened a context on GPU 0 too and holds only module statics there.
    per_process = {(p.pid, p.device) for p in ddp_leak_v25.peaks if p.pid is not None}
    assert per_process == {(2146, 0), (2147, 1)}
    # ...but those statics still count in GPU 0's total across processes
    gpu0 = next(p for p in ddp_leak_v25.peaks if p.pid is None and p.gpu == 0)
    assert gpu0.peak_bytes > next(p for p in ddp_leak_v25.peaks if p.pid == 2146).peak_bytes


def test_single_process_has_no_rank(torch_leak_v25):
    (proc,) = torch_leak_v25.capture.processes
    assert proc.rank is None and proc.label == f"process {proc.pid}"


def test_rank_environment_read_by_key_alone(tmp_path):
    # A copy of a capture whose recorded environment gained RANK/WORLD_SIZE and a secret.
    db = tmp_path / "ranked.sqlite"
    with sqlite3.connect(FIXTURES / "torch_leak_v25.sqlite") as src, sqlite3.connect(db) as dst:
        src.backup(dst)
        dst.executemany("INSERT INTO META_DATA_CAPTURE (name, value) VALUES (?, ?)", [
            ("PROCESS_0:ENVIRONMENT_VARIABLE", 'RANK="3"'),
            ("PROCESS_0:ENVIRONMENT_VARIABLE", 'WORLD_SIZE="8"'),
            ("PROCESS_0:ENVIRONMENT_VARIABLE", 'LOCAL_RANK="3"'),
            ("PROCESS_0:ENVIRONMENT_VARIABLE", 'RANKING_TOKEN="hunter2"'),
            ("PROCESS_0:ENVIRONMENT_VARIABLE", 'AWS_SECRET="RANK=5"'),
        ])
    conn = sqlite3.connect(db)
    schema = probe(conn)
    assert schema.rank_environment == {0: {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}}
    analysis = nsysan.analyze(db)
    (proc,) = analysis.capture.processes
    assert (proc.rank, proc.local_rank, proc.world_size, proc.rank_source) == (3, 3, 8, "environment")
    assert "hunter2" not in render_json(analysis)


def test_launcher_environment_names_no_rank_for_several_children():
    # torchrun's own environment with RANK set (e.g. a nested launch) says nothing about which
    # of its two children is which: GPU order decides.
    processes = [Process(pid=10, name="python"), Process(pid=11, name="python")]
    groups = [_group(10, 1), _group(11, 0)]
    ranked = assign_ranks(processes, groups, {0: {"RANK": "0"}}, {0: 0})
    assert [(p.pid, p.rank, p.rank_source) for p in ranked] == [(10, 1, "gpu order"), (11, 0, "gpu order")]


def test_caps_hold_the_gpu_total(real_oom_v25):
    # real_oom_v25.truth.jsonl: cudaMemGetInfo total 150109880320 (= TARGET_INFO_GPU.totalMemory)
    cap = real_oom_v25.memory_cap(real_oom_v25.capture.processes[0].pid, 0)
    assert (cap.cap_bytes, cap.source) == (150109880320, "gpu_total")


def test_old_documents_without_ranks_or_caps_load():
    document = analysis_of("real_oom_v25").to_dict()
    document.pop("caps")
    for proc in document["capture"]["processes"]:
        for key in ("rank", "local_rank", "world_size", "rank_source", "label"):
            proc.pop(key)
    loaded = nsysan.Analysis.from_dict(document)
    assert loaded.caps == [] and loaded.process_label(loaded.capture.processes[0].pid).startswith("process ")
