"""The verdicts on out of memory, reserved memory and caps, with the diagnostics that put them in
every output: one set of reducers (VerdictLooks) on both paths, the whole frame's one batch
(`run_analyses`) and the streamed full analysis's flow (flow.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from ..engine import GpuOf, Reducer, TotalMemory
from ..base.cuda_errors import error_name
from ..events.arrays import one_pair_key
from ..model import Diagnostic, GroupSummary, MemoryCap, OutOfMemory, Peak, \
    PoolUse, Preallocation, ReservedMemory
from ..base.units import fmt_bytes, fmt_duration, fmt_time
from .allocator import AllocatorSums
from .allocations import Listed
from .preallocations import block_keys, find_preallocations, preallocated
from .caps import memory_caps
from .diagnostics import xla_pids
from .calls import CallOutcomes, frame_chunks
from .oom import OPEN_END_NS, CutShortSums, FailureDevices, Moment, OomLiveSets, ReleaseBursts, _open_ranges, \
    failures_and_probes, gave_up_inside, oom_calls, retries_and_numbers
from .peak import pair_of

if TYPE_CHECKING:
    from ..model.oom_found import OomFailure

MIN_VMM_GRANULARITY = 2 << 20  # cuMemCreate sizes are multiples of the granularity, 2 MiB on every GPU seen


@dataclass(frozen=True)
class Verdicts:
    oom: OutOfMemory
    reserved: ReservedMemory
    caps: list[MemoryCap]
    peaks: list[Peak]  # the peaks, with their notes
    diagnostics: list[Diagnostic]
    replaces: set[str]  # codes of generic diagnostics these verdicts replace


def frame_calls(calls: pd.DataFrame) -> Callable[[], tuple[Iterable[dict], list[str]]]:
    """The calls frame as VerdictLooks reads the calls (`read_calls`): one chunk, and its API names."""
    return lambda: ((chunk for chunk, _ in frame_chunks(calls, len(calls))), list(calls["api"].cat.categories))


class VerdictLooks:
    """The verdicts' reducers and how their answers make the Verdicts, on both paths (the whole
    frame as one batch: run_analyses; the streamed full analysis's flow: flow.py): the
    devices of the out-of-memory calls, the maps given access, what tells a run cut short, the live
    sets at the moments of out of memory and, with API names, the allocators and their bursts of
    frees."""

    def __init__(self, outcomes: CallOutcomes, read_calls: Callable[[], tuple[Iterable[dict], Sequence[str]]],
                 api_names: Optional[list[str]], ranges: pd.DataFrame, gpu_of: GpuOf,
                 total_memory: TotalMemory, process_names: dict[int, str],
                 duration_ns: Optional[int], big_blocks: Callable[[], pd.DataFrame], more: dict) -> None:
        """`outcomes`: how the calls ended (the failed ones, how many ran out of memory, the
        successful cuMemCreate calls per process); `read_calls()`: the calls' chunks and API names
        (retries_and_numbers'), read only when a call failed; `api_names`: the names of the
        batches' API codes (None: --quick, no allocator verdicts); `big_blocks()`: BigBlocks'
        answer, once the first look is done; `more`: the engine's facts (Facts.more), filled here
        but for `allocator_peaks` (AllocatorSums')."""
        self.outcomes, self.read_calls, self.failed = outcomes, read_calls, outcomes.failed
        self.ranges, self.gpu_of, self.total_memory = ranges, gpu_of, total_memory
        self.process_names, self.big_blocks, self.more = process_names, big_blocks, more
        self.devices, self.maps, self.cut = FailureDevices(), AccessMaps(), CutShortSums()
        self.live_sets = OomLiveSets()
        self.sums, self.bursts = (AllocatorSums(), ReleaseBursts()) if api_names is not None else (None, None)
        self.reducers = [self.devices, self.maps, self.cut, self.live_sets] + \
            ([self.sums, self.bursts] if self.sums else [])
        self.xla = frozenset(xla_pids(ranges))  # XLA's allocator is never PyTorch's
        self.open_by_pid = _open_ranges(ranges, duration_ns or OPEN_END_NS)
        self._blocks: Optional[pd.DataFrame] = None
        more.update(api_names=api_names, oom_calls=oom_calls(self.failed), oom_moments=self._moments,
                    allocator_blocks={})

    def blocks(self) -> pd.DataFrame:
        """The preallocated blocks' rows (preallocated), made once the big blocks are known, with
        AllocatorSums' facts of them (`allocator_blocks`)."""
        if self._blocks is None:
            self._blocks = preallocated(self.big_blocks(), self.gpu_of, self.total_memory)
            self.more["allocator_blocks"] = block_keys(self._blocks)
        return self._blocks

    def kind_of(self, pid: int, device: int) -> Optional[str]:
        """The caching allocator of a (process, device) (AllocatorSums.recognized); None under a
        preallocated block or in a process that ran XLA."""
        if self.sums is None or one_pair_key(pid, device) in self.more["allocator_blocks"] or pid in self.xla:
            return None
        return self.sums.recognized(pid, device, "python" in self.process_names.get(pid, "").lower())

    def _moments(self, pairs: list[int]) -> list[Moment]:
        """Between the looks (OomLiveSets asks): the releases of the caching allocators' bursts of
        frees, and the moments whose live sets are wanted: each out-of-memory call's, over its GPU
        (`pairs`: the keys of the pairs with GPU-resident events; its own pair alone when its GPU is
        unknown), and each release after which the allocator gave up."""
        self.blocks()
        caching = {}
        for key in sorted({key for key, _ in self.bursts.bursts}) if self.bursts is not None else []:
            kind = self.kind_of(*pair_of(key))
            if kind is not None and kind.startswith("pytorch"):
                caching[pair_of(key)] = kind
        self.releases = self.bursts.finish({}).releases(caching, self.gpu_of, self.ranges) if self.bursts else []
        self.failure_devices = self.devices.finish({})
        self.failure_moments: list[Optional[Moment]] = []
        for (pid, _, ts), device in zip(self.more["oom_calls"], self.failure_devices):
            if device is None:  # no event tells its device (no memory table, say): no live set
                self.failure_moments.append(None)
                continue
            gpu = self.gpu_of(pid, device)
            members = [k for k in pairs if self.gpu_of(*pair_of(k)) == gpu] if gpu is not None \
                else [one_pair_key(pid, device)]
            self.failure_moments.append(Moment(ts, False, np.array(members, "int64")))
        self.release_moments = {i: Moment(r.start_ns, True, np.array([one_pair_key(r.pid, r.device)], "int64"))
                                for i, r in enumerate(self.releases)
                                if not r.followed_by_allocation and gave_up_inside(r, self.open_by_pid.get(r.pid, []))}
        return [m for m in self.failure_moments if m is not None] + list(self.release_moments.values())

    def verdicts(self, peaks: list[Peak], load_notes: Sequence[Callable[[], str]], groups: list[GroupSummary],
                 pools: list[PoolUse], end_ns: int, listed: Listed, label: Callable[[int], str],
                 free_ts: Optional[dict[int, int]] = None) -> Verdicts:
        """The Verdicts once the looks are done: `load_notes`: each peak's peak.module_load_note,
        for a peak reached by a module load; `end_ns`: the end of the capture's data (a run still
        climbing near it was cut short); `listed`: how the preallocated blocks (their API names)
        and the live sets' allocations are described (allocations.Listed); `free_ts`: when the live
        sets' largest were freed, by seq (the flow's allocations.FreeTimes; the whole frame's
        Listed reads its partner column)."""

        def described(moment: Moment) -> list:
            return listed.allocations(moment.largest, free_ts, moment)

        preallocations = find_preallocations(listed.frame(self.blocks()), self.ranges, self.gpu_of, self.total_memory,
                                             label)
        peaks = [with_note(p, preallocations, note) for p, note in zip(peaks, load_notes)]
        allocators = self.sums.uses(peaks, self.kind_of, preallocations, self.gpu_of, label) if self.sums else []
        retry, number = retries_and_numbers(*self.read_calls(), self.failed) if not self.failed.empty else ((), ())
        failures, probes = failures_and_probes(self.failed, self.ranges, retry, number,
                                               partial(self._failure, described))
        allocator_ooms, flushes = [], []
        for i, release in enumerate(self.releases):
            moment = self.release_moments.get(i)
            if moment is None:  # followed by an allocation, or every range closed: an empty_cache()
                flushes.append(release)
                continue
            from ..model.oom_found import AllocatorOom  # made when found (model/oom_found.py)
            allocator_ooms.append(AllocatorOom(release=release, open_ranges=self.open_by_pid.get(release.pid, []),
                                               live_count=moment.count, live_at_release=described(moment)))
        oom = OutOfMemory(failures=failures, failed_count=self.outcomes.out_of_memory, probes=probes,
                          allocator_ooms=allocator_ooms, cache_flushes=flushes,
                          cut_short=self.cut.judged(self.open_by_pid, end_ns))
        diagnostics = (_oom_diagnostics(oom, label) + _reserved_diagnostics(allocators, preallocations)
                       + vmm_without_access(dict(sorted(self.outcomes.created_by_pid.items())), self.maps.finish({}),
                                            label))
        return Verdicts(oom=oom, reserved=ReservedMemory(allocators=allocators, preallocations=preallocations,
                                                        pools=pools),
                        caps=memory_caps(groups, self.total_memory, verdict_caps(preallocations, oom)), peaks=peaks,
                        diagnostics=diagnostics,
                        # the live set at the failure beats a count; a recognized allocator beats a guess
                        replaces=({"allocation_failed"} if oom.failures else set())
                        | ({"caching_allocator"} if allocators or preallocations else set()))

    def _failure(self, described: Callable[[Moment], list], i: int, pid: int, tid: int, api: str, ts: int, code: int,
                 path: str, retried: Optional[int], number: int) -> OomFailure:
        """The i-th out-of-memory failure, with the live set on its GPU then (`described`: its allocations)."""
        device = self.failure_devices[i]
        gpu = self.gpu_of(pid, device) if device is not None else None
        total = self.total_memory(gpu)
        moment = self.failure_moments[i]
        process_live = gpu_live = None
        count, live = 0, []
        if moment is not None:
            count, live = moment.count, described(moment)
            gpu_live, process_live = sum(moment.by_pid.values()), moment.by_pid.get(pid, 0)
        from ..model.oom_found import OomFailure  # made when found (model/oom_found.py)
        return OomFailure(pid=pid, tid=tid, api=api, time_ns=ts, return_value=code, error=error_name(api, code),
                          call_number=number, nvtx_path=path, device=device, gpu=gpu,
                          process_live_bytes=process_live, gpu_live_bytes=gpu_live, total_memory_bytes=total,
                          headroom_bytes=total - gpu_live if total and gpu_live is not None else None,
                          live_count=count, live_at_failure=live, retried_after_ns=retried)


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
