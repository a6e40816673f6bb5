"""The streamed full analysis's verdicts (verdicts.VerdictLooks, one set of reducers on both paths) and
spikes (one reducer on both paths, spikes.py): the out-of-memory verdicts, the allocators, the caps, their
diagnostics and the spikes are the whole frame's, read in ten batches and more, and against what
the fixtures' truths say (on copies with both event tables shuffled: test_bounded_memory's
whole-document check)."""

from __future__ import annotations

import shutil
import sqlite3

from conftest import FIXTURES
from test_bounded_memory import chunk_rowids, full_documents

MiB = 1 << 20
VERDICT_CODES = {"allocation_failed", "allocator_oom_suspected", "probe", "cache_flushes", "run_cut_short",
                 "caching_allocator", "preallocation", "vmm_without_access"}


def assert_verdicts_are_whole(whole: dict, streamed: dict) -> None:
    assert streamed["oom"] == whole["oom"]
    assert streamed["reserved"] == whole["reserved"]
    assert streamed["caps"] == whole["caps"]
    assert streamed["spikes"] == whole["spikes"]
    assert [d for d in streamed["diagnostics"] if d["code"] in VERDICT_CODES] == \
        [d for d in whole["diagnostics"] if d["code"] in VERDICT_CODES]


def test_streamed_failure_holds_the_live_set_at_the_failed_call(monkeypatch):
    # real_oom_v25.truth.jsonl: eight cudaMallocs of 16 GiB succeed, the ninth fails with error 2
    # in range `fill` and a 1 GiB retry succeeds; TARGET_INFO_GPU.totalMemory 150109880320
    path = FIXTURES / "real_oom_v25.sqlite"
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_verdicts_are_whole(whole, streamed)
    (failure,) = streamed["oom"]["failures"]
    assert (failure["api"], failure["call_number"], failure["return_value"], failure["nvtx_path"]) == \
        ("cudaMalloc", 9, 2, "fill")
    assert failure["process_live_bytes"] == failure["gpu_live_bytes"] == 8 * 16 * 1024 * MiB
    assert failure["headroom_bytes"] == 150109880320 - 8 * 16 * 1024 * MiB
    assert [a["bytes"] for a in failure["live_at_failure"]] == [16 * 1024 * MiB] * 8
    assert failure["retried_after_ns"] is not None and streamed["oom"]["failed_count"] == 1


def test_streamed_allocators_and_caps(monkeypatch):
    # jax_prealloc_v25.truth.jsonl: XLA's bytes_limit, 112583507968, is the block it preallocated
    path = FIXTURES / "jax_prealloc_v25.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert [(c["source"], c["cap_bytes"]) for c in streamed["caps"]] == \
        [("gpu_total", 150109880320), ("xla_preallocation", 112583507968)]
    (use,) = streamed["reserved"]["allocators"]
    assert (use["allocator"], use["inside_at_peak_bytes"]) == ("xla_preallocation", 112583507968)
    # torch_oom_v25.truth.jsonl: PyTorch reserved 5773459456 bytes at its last step before the OOM
    path = FIXTURES / "torch_oom_v25.sqlite"
    _, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    (use,) = streamed["reserved"]["allocators"]
    assert (use["allocator"], use["inside_at_peak_bytes"]) == ("pytorch_caching", 5773459456)
    (gave_up,) = streamed["oom"]["allocator_ooms"]
    assert gave_up["open_ranges"] == ["step 5", "hoard"]  # never closed: the trace ends at the OOM
    assert streamed["caps"][-1] == {**streamed["caps"][-1], "source": "allocator_oom",
                                    "cap_bytes": gave_up["release"]["live_before_bytes"]}
    assert [c["open_ranges"] for c in streamed["oom"]["cut_short"]] == [["step 5", "hoard"]]


def test_streamed_cache_flush_when_the_allocator_went_on(tmp_path, monkeypatch):
    # torch_oom_v25 with one more 2 MiB allocation after its last release: the allocator went on,
    # so the burst is a cache flush, not an out-of-memory
    path = tmp_path / "torch_oom_v25.sqlite"
    shutil.copyfile(FIXTURES / "torch_oom_v25.sqlite", path)
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, pc, "
                     "bytes, memKind, memoryOperationType) SELECT max(start) + 1000, globalPid, deviceId, contextId, "
                     "4096, 0, 2097152, memKind, 0 FROM CUDA_GPU_MEMORY_USAGE_EVENTS")
        conn.commit()
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_verdicts_are_whole(whole, streamed)
    _, original = full_documents(FIXTURES / "torch_oom_v25.sqlite", chunk_rowids(path), monkeypatch)
    assert streamed["oom"]["allocator_ooms"] == []
    assert streamed["oom"]["cache_flushes"] == [{**original["oom"]["allocator_ooms"][0]["release"],
                                                 "followed_by_allocation": True}]
    assert "cache_flushes" in {d["code"] for d in streamed["diagnostics"]}


def test_streamed_spike_within_a_range_names_its_calls_and_sites(monkeypatch):
    # known_bt_v25.truth.jsonl: async_pool_work makes four cudaMallocAsync blocks of 8, 16, 24 and
    # 32 MiB inside the NVTX range `async pool`: a rise found within that range instance
    path = FIXTURES / "known_bt_v25.sqlite"
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert streamed["spikes"] == whole["spikes"]
    (pool,) = [s for s in streamed["spikes"] if s["found_by"] == "range"]
    assert (pool["nvtx_path"], pool["apis"]) == ("async pool", ["cudaMallocAsync"])
    assert [(h["allocations"], h["bytes"], h["nvtx_range"]) for h in pool["sites"]] == \
        [(4, (8 + 16 + 24 + 32) * MiB, "async pool")]


def test_streamed_failure_on_a_thread_without_events(tmp_path, monkeypatch):
    # real_oom_v25's failed cudaMalloc moved to another thread of its process (tid + 1): that
    # thread made no memory event, so the call's device is the process's first event's, and the
    # 1 GiB retry on the first thread no longer makes it a probe-like retry on its own thread
    path = tmp_path / "real_oom_v25.sqlite"
    shutil.copyfile(FIXTURES / "real_oom_v25.sqlite", path)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET globalTid = globalTid + 1 WHERE returnValue = 2")
        conn.commit()
    whole, streamed = full_documents(path, chunk_rowids(path), monkeypatch)
    assert_verdicts_are_whole(whole, streamed)
    (failure,) = streamed["oom"]["failures"]
    assert (failure["device"], failure["retried_after_ns"], failure["tid"]) == (0, None, 536)
    assert failure["process_live_bytes"] == 8 * 16 * 1024 * MiB
