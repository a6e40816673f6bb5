"""The analyses on real captures, checked against what the captured programs really did.

Expected values come from the fixtures' .truth.jsonl files (written by the programs themselves)
or from arithmetic on them, explained where it is done.
"""

from __future__ import annotations

from conftest import truth

MiB = 1 << 20


def device_groups(analysis, pid=None):
    return [g for g in analysis.groups if g.kind == "device" and (pid is None or g.pid == pid)]


# --- known_allocs.cu: every allocation known ------------------------------------------------

def test_device_peak_is_exact_and_inside_burst(known_mem_v25):
    # weights 256 MiB + embeddings 128 MiB + 3 cache entries of 4 MiB + the 512 MiB burst
    expected = (256 + 128 + 3 * 4 + 512) * MiB
    assert expected == 952_107_008
    peak = known_mem_v25.peak
    assert (peak.peak_bytes, peak.nvtx_range, peak.api) == (expected, "burst", "cudaMalloc")
    assert device_groups(known_mem_v25)[0].peak_bytes == expected


def test_live_at_peak_lists_the_blocks_that_make_the_peak(known_mem_v25):
    peak = known_mem_v25.peak
    assert peak.live_count == 6
    assert sorted(a.bytes for a in peak.live_at_peak) == [4 * MiB] * 3 + [128 * MiB, 256 * MiB, 512 * MiB]
    assert sum(a.bytes for a in peak.live_at_peak) == peak.peak_bytes


def test_never_freed_matches_the_truth_file(known_mem_v25):
    leaked = {(r["ptr"], r["bytes"]) for r in truth("known_mem_v25") if r.get("freed") == 0}
    device = [a for a in known_mem_v25.never_freed if a.kind == "device"]
    assert {(a.address, a.bytes) for a in device} == leaked
    assert len(device) == 6
    assert sum(a.bytes for a in device) == 153_067_520
    group = device_groups(known_mem_v25)[0]
    assert (group.never_freed_count, group.never_freed_bytes, group.end_bytes) == (6, 153_067_520, 153_067_520)


def test_every_allocation_family_is_counted(known_mem_v25):
    by_api = {}
    for r in truth("known_mem_v25"):
        if "truth" in r:
            by_api[r["truth"]] = by_api.get(r["truth"], 0) + r["bytes"]
    allocated = {}
    for site in known_mem_v25.sites:
        for api in site.apis:
            allocated[api] = allocated.get(api, 0) + site.allocated_bytes
    assert allocated == by_api
    kinds = {g.kind: g for g in known_mem_v25.groups}
    assert kinds["managed"].allocated_bytes == 2 * MiB and kinds["managed"].end_bytes == 0
    assert kinds["pinned"].allocated_bytes == 3 * MiB and kinds["pinned"].never_freed_count == 0


def test_address_reuse_pairs_each_free_with_its_own_allocation(known_mem_v25):
    # alloc_workspace gets the same address for all nine 32 MiB steps; every one is freed.
    events = known_mem_v25.events
    workspace = 140345673252864
    at_address = events[(events["address"] == workspace) & (events["kind"] == "device")]
    assert list(at_address["op"].astype(str)) == ["alloc", "free"] * 9
    assert (at_address["partner"] >= 0).all()


def test_events_frame_is_available_for_notebooks(known_mem_v25):
    events = known_mem_v25.events
    assert len(events) == 52
    assert set(events["api"].astype(str)) >= {"cudaMalloc", "cudaMallocAsync", "cudaMallocManaged",
                                              "cudaMallocHost", "cudaMallocPitch", "cuMemAlloc"}
    assert events["delta_bytes"].sum() == 153_067_520  # what stays live at the end (nothing static)


def test_worker_threads_are_their_own_threads(known_mem_v25):
    threads = {a.tid for a in known_mem_v25.events.itertuples() if a.nvtx_range in ("worker 1", "worker 2")}
    assert len(threads) == 2 and known_mem_v25.capture.processes[0].threads == 3


def test_backtrace_sites_name_the_functions_that_leak(known_bt_v25):
    leaked = [(a.site.function, a.bytes) for a in known_bt_v25.never_freed]
    assert ("alloc_weights", 128 * MiB) in leaked
    assert [b for f, b in leaked if f == "alloc_cache_entry"] == [4 * MiB] * 3
    assert known_bt_v25.capture.backtraces


def test_backtrace_sites_match_the_truth_sites(known_bt_v25):
    bytes_by_site = {}
    for r in truth("known_bt_v25"):
        if r.get("truth") in ("cudaMalloc",):
            bytes_by_site[r["site"]] = bytes_by_site.get(r["site"], 0) + r["bytes"]
    found = {s.site.function: s.allocated_bytes for s in known_bt_v25.sites
             if s.site.from_stack and s.apis == ["cudaMalloc"]}
    assert found == bytes_by_site
    weights = next(s for s in known_bt_v25.sites if s.site.function == "alloc_weights")
    assert weights.site.label == "alloc_weights (known)"
    assert (weights.never_freed_bytes, weights.max_live_bytes) == (128 * MiB, 384 * MiB)


def test_without_backtraces_sites_are_api_range_and_thread(known_mem_v25):
    labels = {s.site.label for s in known_mem_v25.sites}
    assert "cudaMalloc in burst [known]" in labels
    assert any(d.code == "no_backtraces" for d in known_mem_v25.diagnostics)


# --- captures without sizes, and degraded ones ----------------------------------------------

def test_without_memory_usage_sizes_are_unknown_and_said_so(known_plain_v25):
    assert not known_plain_v25.capture.memory_usage_collected
    assert known_plain_v25.peak is None and known_plain_v25.groups == []
    message = next(d.message for d in known_plain_v25.diagnostics if d.code == "sizes_not_collected")
    # the advice asks for what the capture lacked (it recorded --cuda-memory-usage off, -s none)
    assert "capture again adding --cuda-memory-usage=true" in message
    calls = {c.api: c.calls for c in known_plain_v25.api_calls}
    expected = {}
    for r in truth("known_plain_v25"):
        if "truth" in r:
            expected[r["truth"]] = expected.get(r["truth"], 0) + 1
    assert {api: calls[api] for api in expected} == expected  # cudaMalloc 21, cudaMallocAsync 4, ...
    # the allocation calls the diagnostic counts are the API call table's (every one of the truth's)
    assert f"only API calls can be counted ({sum(expected.values())} allocation calls)" in message


def test_degraded_2022_capture_is_flagged(known_mem_v22):
    codes = {d.code for d in known_mem_v22.diagnostics}
    assert {"cuda_trace_incomplete", "nsys_older_than_cuda"} <= codes
    assert known_mem_v22.capture.nsys_version == "2022.4.2.1"
    # the single event the old nsys kept: the first 256 MiB cudaMalloc
    assert known_mem_v22.peak.peak_bytes == 256 * MiB


# --- PyTorch, expandable segments, DDP, a real failed cudaMalloc -----------------------------

def test_expandable_segments_are_counted_through_the_vmm_api(torch_expandable_v25, torch_leak_v25):
    reserved_at_end = truth("torch_expandable_v25")[-2]["reserved"]  # memory_stats() after the last step
    mapped = sum(a.bytes for a in torch_expandable_v25.events.itertuples()
                 if a.api == "cuMemSetAccess" and a.op == "alloc")
    assert mapped == reserved_at_end == 5_460_983_808
    # The caching allocator's segments equal `reserved`; the rest of the device bytes are six
    # cudaMalloc blocks of library workspaces, the same in both runs.
    workspaces = device_groups(torch_expandable_v25)[0].end_bytes - mapped
    assert workspaces == 134_481_920
    assert device_groups(torch_leak_v25)[0].end_bytes == truth("torch_leak_v25")[-2]["reserved"] + workspaces
    assert any(d.code == "virtual_memory_api" for d in torch_expandable_v25.diagnostics)


def test_pytorch_static_module_memory_is_not_a_leak(torch_leak_v25):
    assert all(a.kind != "static" for a in torch_leak_v25.never_freed)
    static = next(g for g in torch_leak_v25.groups if g.kind == "static")
    assert static.allocations == 1254 and static.allocated_bytes == 886_101
    assert {"static_memory", "caching_allocator"} <= {d.code for d in torch_leak_v25.diagnostics}


def test_pytorch_steps_are_bands_and_backward_is_attributed(torch_leak_v25):
    assert [b.name for b in torch_leak_v25.timeline.bands] == ["setup"] + [f"step {i}" for i in range(6)]
    # backward runs on an autograd thread with no ranges: it falls back to the main thread's
    assert "backward" in {r.name for r in torch_leak_v25.ranges if r.allocations}


def test_ddp_shows_two_processes_on_two_gpus(ddp_leak_v25):
    per_process = {p.pid: p for p in ddp_leak_v25.peaks if p.pid is not None and p.peak_bytes > 1 << 30}
    assert len(per_process) == 2
    assert sorted(p.gpu for p in per_process.values()) == [0, 1]
    assert [p.name for p in ddp_leak_v25.capture.processes] == ["python", "python"]
    rank0, rank1 = sorted(per_process.values(), key=lambda p: p.gpu)
    # rank 1 keeps a 64 MiB tensor every one of the 8 steps; rank 0 keeps nothing
    leak0 = device_groups(ddp_leak_v25, rank0.pid)[0].never_freed_bytes
    leak1 = device_groups(ddp_leak_v25, rank1.pid)[0].never_freed_bytes
    assert leak1 - leak0 >= 8 * 64 * MiB


def test_real_failed_cudamalloc_is_found_in_fill(real_oom_v25):
    records = truth("real_oom_v25")
    failing = next(r for r in records if r.get("error") == 2)
    (failed,) = real_oom_v25.failed_calls
    assert (failed.api, failed.return_value, failed.error, failed.nvtx_range) == \
        ("cudaMalloc", 2, "cudaErrorMemoryAllocation", "fill")
    # every earlier 16 GiB block was live when the 9th one failed
    assert failed.live_bytes == failing["i"] * failing["bytes"] == 8 * (16 << 30)
    assert real_oom_v25.capture.gpus[0].total_memory_bytes == records[0]["total"] == 150_109_880_320
    assert real_oom_v25.peak.peak_bytes == 8 * (16 << 30) + (1 << 30)
    assert real_oom_v25.never_freed_total == 0
