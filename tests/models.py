"""Hand-built `Analysis` models with small, readable values, for renderer tests.

One process (pid 100) on one 1 GiB GPU, 10 ms of capture:

    1 ms   cudaMalloc 256 MiB "weights"    (in NVTX range "setup", never freed)
    5 ms   cudaMalloc 512 MiB "workspace"  (in `nvtx`): the peak, 768 MiB = 75% of the GPU
    6 ms   cudaFree the workspace
    6.5 ms cudaMalloc of 1 GiB fails (cudaErrorMemoryAllocation) with 256 MiB live

Every string a profile could carry (NVTX name, process name, site label, symbol, module,
diagnostic message) can be replaced, to check it is escaped wherever it is shown.
"""

from __future__ import annotations

from nsysan.model import (SCHEMA_ID, Allocation, AllocationGroup, Analysis, ApiCallStat, Band, CallSite, Capture,
                          Diagnostic, FailedCall, Frame, Gpu, GroupSummary, NvtxSpan, Peak, Process, RangeStat, Series,
                          Site, Source, Stack, Timeline)

MiB = 1 << 20
GiB = 1 << 30
PID = 100


def make_analysis(nvtx: str = "step 1", process_name: str = "trainer", site_label: str = "alloc_weights (train)",
                  symbol: str = "alloc_weights(unsigned long)", module: str = "train", gpu_name: str = "Test GPU",
                  source_name: str = "run.sqlite") -> Analysis:
    weights_site = CallSite(label=site_label, function="alloc_weights", symbol=symbol, module=module, from_stack=True,
                            source="native", stack_id=7)
    workspace_site = CallSite(label=f"cudaMalloc in {nvtx} [{process_name}]")
    weights = Allocation(pid=PID, tid=PID, device=0, kind="device", api="cudaMalloc", address=0x7F0000000000,
                         bytes=256 * MiB, alloc_time_ns=1_000_000, free_time_ns=None, nvtx_range="setup",
                         site=weights_site)
    workspace = Allocation(pid=PID, tid=PID, device=0, kind="device", api="cudaMalloc", address=0x7F0010000000,
                           bytes=512 * MiB, alloc_time_ns=5_000_000, free_time_ns=6_000_000, nvtx_range=nvtx,
                           site=workspace_site)
    # The weights' stack, innermost first: the runtime, the site's function, the program's main.
    weights_stack = Stack(id=7, source="native", frames=[Frame("cudaMalloc", module="libcudart.so.13"),
                                                         Frame("alloc_weights", module=module), Frame("main", module=module)])
    def group_of(a: Allocation) -> AllocationGroup:  # each allocation alone in its (site, range) group
        return AllocationGroup(pid=a.pid, device=a.device, kind=a.kind, site=a.site, nvtx_range=a.nvtx_range,
                               count=1, total_bytes=a.bytes, min_bytes=a.bytes, max_bytes=a.bytes,
                               first_alloc_ns=a.alloc_time_ns, last_alloc_ns=a.alloc_time_ns)

    peak = Peak(pid=PID, device=0, gpu=0, peak_bytes=768 * MiB, peak_time_ns=5_000_000, nvtx_range=nvtx,
                api="cudaMalloc", total_memory_bytes=GiB, live_count=2, live_at_peak=[workspace, weights],
                live_groups=[group_of(workspace), group_of(weights)])
    capture = Capture(nsys_version="2025.3.2.0", schema_version="3.20.3", report_version=None,
                      duration_ns=10_000_000, memory_usage_collected=True, memory_usage_requested=True,
                      backtraces=True, nvtx=True, cuda_driver_version="13.0",
                      gpus=[Gpu(id=0, name=gpu_name, total_memory_bytes=GiB, bus="0000:00:01.0")],
                      processes=[Process(pid=PID, name=process_name, devices=[0], threads=1)])
    return Analysis(
        schema=SCHEMA_ID,
        scope="full",
        source=Source(path=source_name, name=source_name, format="sqlite", size_bytes=65536),
        capture=capture,
        groups=[GroupSummary(pid=PID, device=0, kind="device", gpu=0, peak_bytes=768 * MiB, peak_time_ns=5_000_000,
                             end_bytes=256 * MiB, allocations=2, frees=1, allocated_bytes=768 * MiB,
                             never_freed_bytes=256 * MiB, never_freed_count=1, frees_without_alloc=0,
                             frees_without_alloc_bytes=0)],
        peak=peak,
        peaks=[peak],
        never_freed=[weights],
        never_freed_total=1,
        never_freed_groups=[group_of(weights)],
        sites=[Site(site=workspace_site, kind="device", apis=["cudaMalloc"], allocations=1, allocated_bytes=512 * MiB,
                    never_freed_count=0, never_freed_bytes=0, max_live_bytes=512 * MiB, pid=PID),
               Site(site=weights_site, kind="device", apis=["cudaMalloc"], allocations=1, allocated_bytes=256 * MiB,
                    never_freed_count=1, never_freed_bytes=256 * MiB, max_live_bytes=256 * MiB, pid=PID)],
        api_calls=[ApiCallStat(api="cudaMalloc", family="alloc", calls=3, failed=1, total_time_ns=300_000,
                               max_time_ns=200_000),
                   ApiCallStat(api="cudaFree", family="free", calls=1, failed=0, total_time_ns=50_000,
                               max_time_ns=50_000)],
        failed_calls=[FailedCall(pid=PID, tid=PID, api="cudaMalloc", time_ns=6_500_000, return_value=2,
                                 error="cudaErrorMemoryAllocation", nvtx_range=nvtx, live_bytes=256 * MiB)],
        ranges=[RangeStat(name=nvtx, instances=1, total_time_ns=3_000_000, allocations=1, allocated_bytes=512 * MiB,
                          freed_bytes=512 * MiB, still_live_bytes=0, max_live_bytes=768 * MiB,
                          first_start_ns=4_000_000),
                RangeStat(name="setup", instances=1, total_time_ns=1_500_000, allocations=1,
                          allocated_bytes=256 * MiB, freed_bytes=0, still_live_bytes=256 * MiB,
                          max_live_bytes=256 * MiB, first_start_ns=500_000)],
        timeline=Timeline(start_ns=0, end_ns=10_000_000,
                          series=[Series(pid=PID, device=0, kind="device", ts_ns=[1_000_000, 5_000_000, 6_000_000],
                                         live_bytes=[256 * MiB, 768 * MiB, 256 * MiB])],
                          bands=[Band(pid=PID, name="setup", start_ns=500_000, end_ns=2_000_000),
                                 Band(pid=PID, name=nvtx, start_ns=4_000_000, end_ns=7_000_000)],
                          focus_start_ns=800_000, focus_end_ns=7_200_000,
                          spans=[NvtxSpan(PID, PID, "setup", 500_000, 2_000_000, 1),
                                 NvtxSpan(PID, PID, nvtx, 4_000_000, 7_000_000, 1)],
                          allocations=[workspace, weights], allocations_total=2),
        diagnostics=[Diagnostic("info", "caching_allocator", f"{process_name} may keep freed memory reserved"),
                     Diagnostic("error", "allocation_failed", f"1 memory call failed, in NVTX range {nvtx}")],
        stacks=[weights_stack],
    )
