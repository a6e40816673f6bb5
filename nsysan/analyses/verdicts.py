"""The verdicts on out of memory, reserved memory and caps, gathered for `run_analyses`, with the
diagnostics that put them in every output."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import pandas as pd

from ..engine import Engine, Facts, Reducer, frame_batch
from ..events.stream import EventBatch
from ..model import AllocatorUse, CacheRelease, Diagnostic, GroupSummary, MemoryCap, OutOfMemory, Peak, \
    PoolUse, Preallocation, ReservedMemory
from ..base.units import fmt_bytes, fmt_duration, fmt_time
from .allocator import AllocatorSums
from .preallocations import block_keys, find_preallocations, preallocated
from .caps import memory_caps
from .diagnostics import xla_pids
from .calls import failed_call_rows
from .oom import CutShortSums, FailureDevices, ReleaseBursts, find_out_of_memory, oom_calls

MIN_VMM_GRANULARITY = 2 << 20  # cuMemCreate sizes are multiples of the granularity, 2 MiB on every GPU seen


@dataclass(frozen=True)
class Verdicts:
    oom: OutOfMemory
    reserved: ReservedMemory
    caps: list[MemoryCap]
    peaks: list[Peak]  # the peaks, with their notes
    diagnostics: list[Diagnostic]
    replaces: set[str]  # codes of generic diagnostics these verdicts replace


def find_verdicts(events: pd.DataFrame, calls: pd.DataFrame, ranges: pd.DataFrame, peaks: list[Peak],
                  groups: list[GroupSummary], gpu_of: Callable[[int, int], Optional[int]],
                  total_memory: Callable[[Optional[int]], Optional[int]], to_allocations: Callable,
                  process_names: dict[int, str], label: Callable[[int], str], end_ns: int,
                  duration_ns: Optional[int], quick: bool = False,
                  pools: Optional[list[PoolUse]] = None, batch: Optional[EventBatch] = None, *,
                  load_notes: Sequence[Callable[[], str]], big_blocks: pd.DataFrame) -> Verdicts:
    """`quick`: the events have no API names or threads (analyze --quick), which telling an
    allocator's segments from library workspaces needs: no allocator verdicts then; `batch`: the
    events as one batch (engine.frame_batch), when made already; `load_notes`: each peak's
    peak.module_load_note, for a peak reached by a module load; `big_blocks`: BigBlocks' answer."""
    blocks = preallocated(big_blocks, gpu_of, total_memory)
    preallocations = find_preallocations(events.iloc[blocks["seq"].to_numpy()], ranges, gpu_of, total_memory, label)
    looked = _looked(events, calls, peaks, gpu_of, block_keys(blocks), quick,
                     batch if batch is not None else frame_batch(events))
    allocators, releases = _allocators(looked, ranges, peaks, gpu_of, process_names, preallocations, label) \
        if not quick else ([], [])
    oom = find_out_of_memory(events, calls, ranges, gpu_of, total_memory, to_allocations, releases,
                             looked["failure_devices"], end_ns, duration_ns, looked["cut_short"])
    found_caps = verdict_caps(preallocations, oom)
    diagnostics = (_oom_diagnostics(oom, label) + _reserved_diagnostics(allocators, preallocations)
                   + _vmm_without_access(calls, looked["access_maps"], label))
    return Verdicts(oom=oom, reserved=ReservedMemory(allocators=allocators, preallocations=preallocations,
                                                     pools=pools or []),
                    caps=memory_caps(groups, total_memory, found_caps),
                    peaks=[with_note(p, preallocations, note) for p, note in zip(peaks, load_notes)], diagnostics=diagnostics,
                    # the live set at the failure beats a count; a recognized allocator beats a guess
                    replaces=({"allocation_failed"} if oom.failures else set())
                    | ({"caching_allocator"} if allocators or preallocations else set()))


def _looked(events: pd.DataFrame, calls: pd.DataFrame, peaks: list[Peak],
            gpu_of: Callable[[int, int], Optional[int]], blocks: dict, quick: bool, batch: EventBatch) -> dict:
    """The verdicts' reducers over the whole frame as one batch, its peaks known before: the devices
    of the failed calls, the maps given access, what tells a process cut short, and (unless `quick`:
    no API names nor threads) the allocators and their bursts of frees."""
    more = {"api_names": list(events["api"].cat.categories), "oom_calls": oom_calls(failed_call_rows(calls)),
            "allocator_blocks": blocks,
            "allocator_peaks": [(p.pid, p.device, p.peak_time_ns) for p in peaks if p.pid is not None]}
    reducers = [FailureDevices(), AccessMaps(), CutShortSums()] + ([] if quick else [AllocatorSums(), ReleaseBursts()])
    return Engine(reducers, Facts(list(events["kind"].cat.categories), gpu_of, more)).run([batch], {})


def _allocators(looked: dict, ranges: pd.DataFrame, peaks: list[Peak], gpu_of: Callable[[int, int], Optional[int]],
                process_names: dict[int, str], preallocations: list[Preallocation],
                label: Callable[[int], str]) -> tuple[list[AllocatorUse], list[CacheRelease]]:
    """The allocators (AllocatorSums) and the bursts of frees of those that cache (ReleaseBursts);
    the processes that ran XLA (diagnostics.xla_pids) never have PyTorch's allocator."""
    sums, xla = looked["allocators"], frozenset(xla_pids(ranges))
    uses = sums.uses(peaks, lambda pid, device: None if pid in xla else sums.recognized(
        pid, device, "python" in process_names.get(pid, "").lower()), preallocations, gpu_of, label)
    caching = {(u.pid, u.device): u.allocator for u in uses if u.allocator.startswith("pytorch")}
    return uses, looked["cache_bursts"].releases(caching, gpu_of, ranges)


def verdict_caps(preallocations: list[Preallocation], oom: OutOfMemory) -> list[MemoryCap]:
    """The caps the verdicts found: XLA's preallocated blocks, and what an allocator gave up at."""
    found = [MemoryCap(pid=p.pid, device=p.device, gpu=p.gpu, cap_bytes=p.bytes, source="xla_preallocation",
                       note="XLA's allocator never goes beyond the block it preallocated")
             for p in preallocations if p.framework == "XLA"]
    return found + [MemoryCap(pid=o.release.pid, device=o.release.device, gpu=o.release.gpu,
                              cap_bytes=o.release.live_before_bytes, source="allocator_oom",
                              note="the allocator gave up holding this much; its cap (a memory fraction, or the "
                                   "GPU's free memory) is not in the trace")
                    for o in oom.allocator_ooms]


# --- peaks that need a word --------------------------------------------------------------------

def with_note(peak: Peak, preallocations: list[Preallocation], module_load_note: Callable[[], str]) -> Peak:
    """The peak with its note: the preallocated block under it, and `module_load_note()` when a
    module load reached it."""
    parts = []
    block = next((p for p in preallocations if p.pid == peak.pid and p.device == peak.device
                  or peak.pid is None and p.gpu == peak.gpu), None)
    if block is not None:
        parts.append(f"{fmt_bytes(block.bytes)} of it is one block "
                     f"{'XLA preallocated' if block.framework == 'XLA' else 'reserved'} at {fmt_time(block.time_ns)}:"
                     " the reservation, not the use inside it")
    # at the session's first instant it is no load but the state a late capture found
    # (model.LIVE_AT_START; --quick, which reads no calls, keeps the static's own label)
    if peak.api == "(module load)" and peak.peak_time_ns > 0:
        parts.append(module_load_note())
    return dataclasses.replace(peak, note="; ".join(p for p in parts if p)) if parts else peak


# --- diagnostics -------------------------------------------------------------------------------

FRACTION_HINT = ("a cap set with torch.cuda.set_per_process_memory_fraction is invisible to nsys; the program's "
                 "own error message says how much it tried to allocate and what was allowed")


def _oom_diagnostics(oom: OutOfMemory, label: Callable[[int], str]) -> list[Diagnostic]:
    found = []
    for failure in oom.failures[:1]:
        where = f" in {failure.nvtx_path}" if failure.nvtx_path else ""
        held = ""
        if failure.gpu_live_bytes is not None:
            held = f"; {fmt_bytes(failure.gpu_live_bytes)} was live on GPU {failure.gpu}"
            if failure.headroom_bytes is not None:
                held += (f" of its {fmt_bytes(failure.total_memory_bytes)}, leaving at most "
                         f"{fmt_bytes(failure.headroom_bytes)} (the CUDA context and kernel images, not in the "
                         "trace, take part of that)")
        count = oom.failed_count
        first = (f"{count} memory calls failed with out-of-memory; the first, " if count > 1
                 else "1 memory call failed with out-of-memory: ")
        found.append(Diagnostic("warning", "allocation_failed",
                                f"{first}{label(failure.pid)}'s call #{failure.call_number} of {failure.api}, failed with "
                                f"{failure.error} at {fmt_time(failure.time_ns)}{where}{held}; nsys does not record "
                                "the size a failed call asked for"))
    for release in (o.release for o in oom.allocator_ooms):
        opened = next(o.open_ranges for o in oom.allocator_ooms if o.release is release)
        found.append(Diagnostic("warning", "allocator_oom_suspected",
                                f"{label(release.pid)} on GPU {release.gpu}: at {fmt_time(release.start_ns)}"
                                f"{' in ' + release.nvtx_path if release.nvtx_path else ''} the caching allocator "
                                f"freed {release.blocks} cached blocks ({fmt_bytes(release.released_bytes)}) within "
                                f"{fmt_duration(release.end_ns - release.start_ns)}, from "
                                f"{fmt_bytes(release.live_before_bytes)} live to {fmt_bytes(release.live_after_bytes)}, "
                                "and allocated nothing after"
                                + (f"; ranges left open: {', '.join(opened)}" if opened else "")
                                + ". That is how PyTorch's allocator fails (torch.OutOfMemoryError): it frees its "
                                  f"cache, retries, and gives up; {FRACTION_HINT}"))
    for probe in oom.probes[:3]:
        found.append(Diagnostic("info", "probe",
                                f"{label(probe.pid)}: {probe.api} returned {probe.error} ({probe.return_value}) at "
                                f"{fmt_time(probe.time_ns)} and succeeded {fmt_duration(probe.retried_after_ns)} "
                                "later: a probe for a feature the system refuses, not a failure"))
    if oom.cache_flushes:
        blocks = sum(f.blocks for f in oom.cache_flushes)
        size = sum(f.released_bytes for f in oom.cache_flushes)
        found.append(Diagnostic("info", "cache_flushes",
                                f"{len(oom.cache_flushes)} times the caching allocator gave cached blocks back to the "
                                f"driver and went on ({blocks} blocks, {fmt_bytes(size)}): empty_cache() calls or "
                                "allocation retries after freeing the cache (PyTorch's num_alloc_retries); each "
                                "one costs a synchronization and new cudaMallocs"))
    for cut in oom.cut_short:
        reasons = []
        if cut.open_ranges:
            reasons.append(f"NVTX ranges {' > '.join(cut.open_ranges)} never closed")
        if cut.climbing:
            reasons.append(f"memory was still climbing ({fmt_bytes(cut.end_live_bytes)} at the end)")
        found.append(Diagnostic("warning", "run_cut_short",
                                f"{label(cut.pid)} was cut short: {' and '.join(reasons)}; the capture ends while it "
                                "was working (a crash, an exception, or --duration), so its last numbers are not "
                                "its final ones"))
    return found


def _reserved_diagnostics(allocators: list, preallocations: list[Preallocation]) -> list[Diagnostic]:
    found = [Diagnostic("info", "caching_allocator", use.message) for use in allocators
             if not use.allocator.endswith("preallocation")]
    found += [Diagnostic("warning" if p.framework == "XLA" else "info", "preallocation", p.message)
              for p in preallocations]
    return found


def _vmm_without_access(calls: pd.DataFrame, mapped: dict, label: Callable[[int], str]) -> list[Diagnostic]:
    """Physical memory made with cuMemCreate that no memory event counts: nsys emits the event at
    cuMemSetAccess, one per mapped handle, so successful cuMemCreate calls beyond the
    cuMemSetAccess events of a process (`mapped`: AccessMaps) were never made accessible."""
    if calls.empty:
        return []
    created = calls[((calls["api"] == "cuMemCreate") & (calls["return_value"] == 0)).to_numpy()]
    if created.empty:
        return []
    return vmm_without_access(created["pid"].value_counts().sort_index().to_dict(), mapped, label)


class AccessMaps(Reducer):
    """The memory events of cuMemSetAccess (the maps given access) per process, for
    vmm_without_access. Facts: `api_names` (without cuMemSetAccess among them nothing is counted)."""

    field = "access_maps"
    needs = ("api_names",)

    def start(self, facts) -> None:
        super().start(facts)
        names = facts.more.get("api_names") or []
        self.code = names.index("cuMemSetAccess") if "cuMemSetAccess" in names else None
        self.mapped: dict[int, int] = {}

    def add(self, b) -> None:
        if self.code is not None:
            maps = b.pid[b.is_alloc & (b.calls["api"] == self.code)]
            for pid, count in zip(*np.unique(maps, return_counts=True)):  # a few processes
                self.mapped[int(pid)] = self.mapped.get(int(pid), 0) + int(count)

    def finish(self, live: dict) -> dict[int, int]:
        return self.mapped


def vmm_without_access(created: dict, mapped: dict, label: Callable[[int], str]) -> list[Diagnostic]:
    """The diagnostics of _vmm_without_access from the successful cuMemCreate calls and the
    cuMemSetAccess events, per process (`created` in process order)."""
    found = []
    for pid, count in created.items():
        missing = int(count) - int(mapped.get(pid, 0))
        if missing > 0:
            found.append(Diagnostic(
                "warning", "vmm_without_access",
                f"{label(int(pid))}: {missing} of its {int(count)} cuMemCreate allocations were never given access "
                "with cuMemSetAccess, so no memory event counts them: at least "
                f"{fmt_bytes(missing * MIN_VMM_GRANULARITY)} of physical GPU memory (nsys does not record "
                "cuMemCreate's size; 2 MiB is the smallest granularity) is in no number here for as long as "
                "it was held"))
    return found
