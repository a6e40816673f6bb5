"""Out of memory, probes, allocator OOMs and runs cut short (issue 17, section 2)."""

from __future__ import annotations

import pytest
from builders import make_export
from conftest import analysis_of, truth

import nsysan
from nsysan.base.cuda_errors import error_name

MiB, GiB, KiB = 1 << 20, 1 << 30, 1 << 10
# cuBLAS's workspace on each of the two threads that call it: 1 KiB + 128 KiB + 64 MiB (see
# test_allocator.py); PyTorch's reserved bytes plus these are the live device bytes.
OUTSIDE_TORCH = 2 * (64 * MiB + 128 * KiB + 1 * KiB)


@pytest.fixture(scope="module")
def torch_oom_v25():
    return analysis_of("torch_oom_v25")


def test_failed_cudamalloc_shows_the_live_set_at_the_failure(real_oom_v25):
    records = truth("real_oom_v25")
    total = records[0]["total"]
    allocs = [r for r in records if r.get("truth") == "cudaMalloc" and "i" in r]
    before = [r for r in allocs if r["error"] == 0]
    failed = next(r for r in allocs if r["error"] == 2)
    (failure,) = real_oom_v25.oom.failures
    assert failure.call_number == failed["i"] + 1  # i counts from 0: the 9th call
    assert (failure.api, failure.error, failure.nvtx_path) == ("cudaMalloc", "cudaErrorMemoryAllocation", "fill")
    # at the failure, not at the later peak (which also holds the 1 GiB retry)
    assert failure.gpu_live_bytes == failure.process_live_bytes == sum(r["bytes"] for r in before)
    assert failure.total_memory_bytes == total == 150109880320
    assert failure.headroom_bytes == total - sum(r["bytes"] for r in before)
    assert failure.live_count == len(before)
    assert sorted(a.address for a in failure.live_at_failure) == sorted(r["ptr"] for r in before)
    assert failure.retried_after_ns is not None  # the 1 GiB retry succeeded
    assert real_oom_v25.oom.failed_count == 1 and real_oom_v25.oom.probes == []
    message = next(d.message for d in real_oom_v25.diagnostics if d.code == "allocation_failed")
    assert "1 memory call failed" in message and "call #9" in message
    assert "does not record the size" in message and "context" in message


def test_cuda_errors_are_named_from_both_enums():
    assert error_name("cuMemCreate", 800) == "CUDA_ERROR_NOT_PERMITTED"
    assert error_name("cudaMalloc", 800) == "cudaErrorNotPermitted"
    assert error_name("cudaMalloc", 2) == "cudaErrorMemoryAllocation"
    assert error_name("cuMemAlloc", 2) == "CUDA_ERROR_OUT_OF_MEMORY"
    assert error_name("cudaMallocAsync", 3) == "cudaErrorInitializationError"  # runtime and driver differ here
    assert error_name("cuMemCreate", 3) == "CUDA_ERROR_NOT_INITIALIZED"
    assert error_name("cuMemMap", 123456) == "error 123456"


def test_refused_cumemcreate_retried_at_once_is_a_probe(torch_expandable_v25):
    (probe,) = torch_expandable_v25.oom.probes
    assert (probe.api, probe.return_value, probe.error) == ("cuMemCreate", 800, "CUDA_ERROR_NOT_PERMITTED")
    assert probe.retried_after_ns < 10_000_000
    assert torch_expandable_v25.oom.failures == [] and torch_expandable_v25.oom.allocator_ooms == []
    (failed,) = torch_expandable_v25.failed_calls
    assert failed.error == "CUDA_ERROR_NOT_PERMITTED"
    codes = {d.code: d.severity for d in torch_expandable_v25.diagnostics}
    assert codes["probe"] == "info" and "allocation_failed" not in codes


def test_allocator_oom_without_a_failing_call(torch_oom_v25):
    (oom,) = torch_oom_v25.oom.allocator_ooms
    release = oom.release
    # 25 cached blocks: 20 + 6 x 24 + 8 x 32 + 3 x 126 + 2 x 134 + 5 x 2 MiB = 1076 MiB
    assert release.blocks == 25 and release.released_bytes == 1076 * MiB
    assert release.end_ns - release.start_ns < 3_000_000
    assert release.nvtx_path == "step 5 > hoard" and oom.open_ranges == ["step 5", "hoard"]
    assert not release.followed_by_allocation
    # Before the release the allocator held what PyTorch reported as reserved after step 4 (step 5
    # reused its cache until the hoard asked for 1.5 GiB); after it, "4.17 GiB allocated by PyTorch,
    # and 155.95 MiB is reserved by PyTorch but unallocated" (torch_oom_v25.stderr.txt).
    steps = [r for r in truth("torch_oom_v25") if "step" in r]
    assert release.live_before_bytes - OUTSIDE_TORCH == steps[-1]["reserved"]
    reserved_after = release.live_after_bytes - OUTSIDE_TORCH
    assert abs(reserved_after - (4.17 * GiB + 155.95 * MiB)) < 0.005 * GiB + 0.005 * MiB
    assert oom.live_count > 0 and oom.live_at_release[0].bytes == max(a.bytes for a in oom.live_at_release)
    cap = torch_oom_v25.memory_cap(release.pid, release.device)
    assert (cap.source, cap.cap_bytes) == ("allocator_oom", release.live_before_bytes)
    message = next(d.message for d in torch_oom_v25.diagnostics if d.code == "allocator_oom_suspected")
    assert "step 5 > hoard" in message and "set_per_process_memory_fraction" in message
    (cut,) = torch_oom_v25.oom.cut_short
    assert cut.open_ranges == ["step 5", "hoard"] and cut.pid == release.pid


@pytest.mark.parametrize("name", ["torch_leak_v25", "torch_clean_v25", "torch_expandable_v25", "ddp_leak_v25",
                                  "known_mem_v25", "real_oom_v25", "jax_prealloc_v25"])
def test_finished_runs_raise_no_allocator_oom(name):
    analysis = analysis_of(name)
    assert analysis.oom.allocator_ooms == [] and analysis.oom.cut_short == []
    # ddp_leak_v25's ncclCommDestroy unmaps NCCL's buffers in bursts: not the caching allocator's cache
    assert analysis.oom.cache_flushes == []


def _burst_export(tmp_path, then_allocate: bool, close_ranges: bool, nvtx: bool = True):
    """A Python process with a caching allocator's segments (2 MiB, 20 MiB, 64 MiB) that frees
    three of them in 2 ms, then allocates again or not (in an NVTX range `step 0`, or none)."""
    sizes = [2 * MiB, 20 * MiB, 64 * MiB, 2 * MiB, 20 * MiB]
    memory = [(1000 + 100 * i, 0x10000000 * (i + 1), size, 0, i + 1) for i, size in enumerate(sizes)]
    calls = [(1000 + 100 * i, 1050 + 100 * i, "cudaMalloc_v3020", i + 1) for i in range(len(sizes))]
    for j in range(3):
        memory.append((5_000_000 + 1_000_000 * j, 0x10000000 * (j + 1), sizes[j], 1, 10 + j))
        calls.append((5_000_000 + 1_000_000 * j, 5_000_050 + 1_000_000 * j, "cudaFree_v3020", 10 + j))
    if then_allocate:
        memory.append((8_000_000, 0x90000000, 2 * MiB, 0, 20))
        calls.append((8_000_000, 8_000_050, "cudaMalloc_v3020", 20))
    end = 9_000_000 if close_ranges else None
    path = make_export(tmp_path / "burst.sqlite", memory=memory, calls=calls,
                       nvtx=[(500, end, "step 0")] if nvtx else None)
    import sqlite3
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE PROCESSES SET name = 'python3'")
    return nsysan.analyze(path)


def test_release_burst_followed_by_allocations_is_a_cache_flush(tmp_path):
    analysis = _burst_export(tmp_path, then_allocate=True, close_ranges=True)
    (flush,) = analysis.oom.cache_flushes
    assert (flush.blocks, flush.released_bytes) == (3, 86 * MiB) and flush.followed_by_allocation
    assert analysis.oom.allocator_ooms == []
    assert any(d.code == "cache_flushes" for d in analysis.diagnostics)


def test_release_burst_with_ranges_left_open_is_an_allocator_oom(tmp_path):
    analysis = _burst_export(tmp_path, then_allocate=False, close_ranges=False)
    (oom,) = analysis.oom.allocator_ooms
    assert oom.open_ranges == ["step 0"] and oom.release.blocks == 3
    assert oom.release.live_before_bytes == 108 * MiB and oom.release.live_after_bytes == 22 * MiB


def test_release_burst_before_a_clean_exit_is_not_an_oom(tmp_path):
    analysis = _burst_export(tmp_path, then_allocate=False, close_ranges=True)
    assert analysis.oom.allocator_ooms == [] and len(analysis.oom.cache_flushes) == 1


def test_verdicts_show_in_terminal_and_html(real_oom_v25, torch_oom_v25):
    import io

    from rich.console import Console

    from nsysan.render.html import render_html
    from nsysan.render.terminal import render_terminal

    console = Console(width=200, record=True, file=io.StringIO())
    render_terminal(torch_oom_v25, console)
    text = console.export_text()
    first_screen = text[:text.index("Peak GPU memory")]
    assert "allocator OOM?" in first_screen and "step 5 > hoard" in first_screen
    page = render_html(real_oom_v25)
    assert "Out of memory: what was live" in page and "call #9" in page


def test_release_burst_without_nvtx_is_not_an_oom_nor_a_cap(tmp_path):
    """empty_cache() in a script without NVTX, then the run goes on without allocating: the rule
    is ranges left open, so no 'allocator OOM?' and no cap made from its live bytes."""
    analysis = _burst_export(tmp_path, then_allocate=False, close_ranges=True, nvtx=False)
    assert analysis.oom.allocator_ooms == [] and len(analysis.oom.cache_flushes) == 1
    assert all(c.source != "allocator_oom" for c in analysis.caps)
    assert analysis.oom.fatal == [] and not any(d.code == "allocator_oom_suspected" for d in analysis.diagnostics)


def test_every_warning_is_on_the_first_screen(ddp_leak_v25):
    """ddp_leak_v25's ranks each made one cuMemCreate never given access (warning
    vmm_without_access, topic 'reserved'): printed before the tables, as every other warning."""
    import io

    from rich.console import Console

    from nsysan.render.terminal import render_terminal

    warnings = [a for a in ddp_leak_v25.answers if a.severity in ("warning", "error")]
    assert any(a.topic == "reserved" and a.code == "vmm_without_access" for a in warnings)
    console = Console(width=200, record=True, file=io.StringIO())
    render_terminal(ddp_leak_v25, console)
    text = console.export_text()
    first_screen = text[:text.index("Peak GPU memory")]
    for answer in warnings:
        assert answer.message[:60] in " ".join(first_screen.split()), answer.code
