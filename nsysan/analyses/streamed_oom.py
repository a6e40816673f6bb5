"""verdicts.find_verdicts over a flow of event batches, in bounded memory (the streamed full
analysis, streamed_full.py): the out-of-memory verdicts, the allocators, the caps and their
diagnostics, equal to the whole frame's.

The first pass is the flow engine's: the allocators (allocator.AllocatorSums), the caching
allocators' bursts of frees (oom.ReleaseBursts), the device each out-of-memory call most likely
targeted (oom.FailureDevices) and the maps each process gave access to (verdicts.AccessMaps), the
whole frame's reducers, listed in VerdictLooks.reducers. Knowing from it when each failure and
each allocator's last release happened, the second pass keeps the live set at those few moments
(as the peaks keep theirs: the allocations live before the batch, those closed, the batch's up to
that event), with what the calls say of the largest (thread, API, site). A scan of the calls
adds, for the failed ones only, each one's number among its process's calls of that API and the
retry that makes it a probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..base.cuda_errors import OUT_OF_MEMORY, error_name
from ..events.arrays import HIGH, pair_key
from ..events.nvtx import attribute_ranges
from ..events.stream import batch_rows
from ..model import AllocatorOom, Diagnostic, OomFailure, OutOfMemory, Probe, ReservedMemory
from .caps import memory_caps
from .diagnostics import xla_pids
from .oom import LIVE_LISTED, MAX_FAILURES, OPEN_END_NS, PROBE_RETRY_NS, FailureDevices, ReleaseBursts, \
    _open_ranges, gave_up_inside, oom_calls
from .streamed import RESIDENT
from .allocator import AllocatorSums
from .preallocations import block_keys, preallocated
from .streamed_run import _pair
from .verdicts import AccessMaps, Verdicts, _oom_diagnostics, _reserved_diagnostics, verdict_caps, vmm_without_access


@dataclass
class Moment:
    """A moment whose live set is wanted: right after the last event at or before `ts` (before it
    when `strict`), over the GPU-resident allocations of the pairs `members`."""

    ts: int
    strict: bool
    members: np.ndarray
    resolved: bool = False
    count: int = 0
    by_pid: dict = field(default_factory=dict)  # pid -> its live bytes
    largest: pd.DataFrame = field(default_factory=pd.DataFrame)  # the LIVE_LISTED largest: batch_rows columns


class SecondOom:
    """The second pass's consumer: the live sets at the moments; a
    watcher of `sites` (streamed_sites.SiteSums), fed each batch with what it knows of the
    allocations."""

    def __init__(self, moments: list[Moment], sites) -> None:
        self.moments, self.sites = moments, sites
        self.closed: list[pd.DataFrame] = []  # allocations never to be freed, of the batches so far
        self.wanted: set = set()
        self.free_ts: dict = {}

    def add(self, b, known: dict) -> None:
        if len(b) == 0:
            return
        for moment in self.moments:
            if moment.resolved:
                continue
            cut = int(np.searchsorted(b.ts, moment.ts, side="left" if moment.strict else "right"))
            if cut < len(b):  # the moment is in this batch, or just before it
                target = int(b.seq[cut - 1]) if cut else -1
                allocs = np.flatnonzero(b.is_alloc & (b.seq <= target))
                freed = b.partner_seq[(b.partner_seq >= 0) & (b.seq <= target)]
                self._resolve(moment, [pd.DataFrame(b.live_before)] + self.closed + [batch_rows(b, allocs)], freed,
                              [known])
        frees = np.flatnonzero(b.partner_seq >= 0)
        if self.wanted and len(frees):
            hit = np.isin(b.partner_seq[frees], np.fromiter(self.wanted, "int64"))
            for alloc, ts in zip(b.partner_seq[frees[hit]].tolist(), b.ts[frees[hit]].tolist()):
                self.free_ts[alloc] = ts
        if len(b.closed.get("seq", [])):
            self.closed.append(pd.DataFrame(b.closed))

    def finish(self, live: dict) -> None:
        """The moments after the last event: the allocations live at the end (EventFlow.live)."""
        for moment in self.moments:
            if not moment.resolved:
                self._resolve(moment, [pd.DataFrame(live)] + self.closed, np.zeros(0, "int64"), [self.sites.live])

    def _resolve(self, moment: Moment, parts: list[pd.DataFrame], freed: np.ndarray, sources: list[dict]) -> None:
        frame = pd.concat([p for p in parts if len(p)] or [_rows_of_nothing()], ignore_index=True)
        keep = ~frame["seq"].isin(freed).to_numpy() & frame["kind"].isin(RESIDENT).to_numpy() \
            & np.isin(pair_key(frame["pid"].to_numpy(), frame["device"].to_numpy()), moment.members)
        live = frame[keep].sort_values("seq", kind="stable", ignore_index=True)
        moment.resolved, moment.count = True, int(len(live))
        moment.by_pid = {int(k): int(v) for k, v in live.groupby("pid")["bytes"].sum().items()}
        moment.largest = live.iloc[np.argsort(-live["bytes"].to_numpy(), kind="stable")[:LIVE_LISTED]] \
            .reset_index(drop=True)
        seqs = moment.largest["seq"].to_numpy()
        self.wanted |= set(seqs.tolist())
        # what the calls say of them (SiteSums.allocation_info reads it as a peak's)
        info = {c: np.concatenate([s[c] for s in sources + self.sites.closed]) for c in sources[0]}
        rows = np.flatnonzero(np.isin(info["seq"], seqs))
        self.sites.at_peak[id(moment)] = ({c: v[rows] for c, v in info.items()}, "", "", "")


def _rows_of_nothing() -> pd.DataFrame:
    return pd.DataFrame({c: np.zeros(0, "int64") for c in ("seq", "ts", "pid", "device", "kind", "address", "bytes")})


class VerdictLooks:
    """What the two passes find for the verdicts, and how they are put together (find_verdicts)."""

    def __init__(self, calls, ranges: pd.DataFrame, gpu_of, total_memory, process_names: dict,
                 duration_ns: Optional[int], more: dict) -> None:
        """`more`: the flow's engine's facts (Facts.more), for `sums`, the allocators' reducer
        (listed in that engine): the API names, then the preallocated blocks and the peaks."""
        self.calls, self.ranges, self.gpu_of, self.total_memory = calls, ranges, gpu_of, total_memory
        self.process_names, self.duration_ns, self.more = process_names, duration_ns, more
        # reducers of the flow's engine: the allocators, their bursts of frees, the failed calls' devices, the maps
        self.reducers = self.sums, self.bursts, self.devices, self.maps = \
            AllocatorSums(), ReleaseBursts(), FailureDevices(), AccessMaps()
        self.look = None  # run_streamed's SecondLook, once the second pass begins
        # the peaks are raised during the second look (a callable: the sums wait for it)
        more.update(api_names=calls.api_names, allocator_blocks={}, allocator_peaks=self._peaks,
                    oom_calls=oom_calls(calls.failed))
        self.second: Optional[SecondOom] = None

    def second_pass(self, look, sites) -> SecondOom:
        """After the first pass (`look`: run_streamed's SecondLook, its peaks and FirstLook)."""
        first = look.first
        gpu_of = self.gpu_of
        blocks = self.more["allocator_blocks"] = block_keys(preallocated(first.big_blocks, gpu_of, self.total_memory))
        self.look = look
        self.kinds = {}
        xla = xla_pids(self.ranges)  # XLA's allocator is never PyTorch's
        for s in look.peaks:
            if s.pid is not None and int(s.members[0]) not in blocks and s.pid not in xla:
                self.kinds[(s.pid, s.device)] = self.sums.recognized(
                    s.pid, s.device, "python" in self.process_names.get(s.pid, "").lower())
        caching = {pair: kind for pair, kind in self.kinds.items() if kind and kind.startswith("pytorch")}
        self.releases = self.bursts.finish({}).releases(caching, gpu_of, self.ranges)
        self.open_by_pid = _open_ranges(self.ranges, self.duration_ns or OPEN_END_NS)
        pairs = [_pair(k) for k in first.pairs]
        self.failure_moments: list[Optional[Moment]] = []
        self.failure_devices = self.devices.finish({})
        for (pid, _, ts), device in zip(self.more["oom_calls"], self.failure_devices):
            if device is None:
                self.failure_moments.append(None)
                continue
            gpu = gpu_of(pid, device)
            members = [(p, d) for p, d in pairs if gpu_of(p, d) == gpu] if gpu is not None else [(pid, device)]
            self.failure_moments.append(Moment(ts, False, _keys(members)))
        self.release_moments: dict[int, Moment] = {}
        for i, release in enumerate(self.releases):
            if not release.followed_by_allocation and gave_up_inside(release, self.open_by_pid.get(release.pid, [])):
                self.release_moments[i] = Moment(release.start_ns, True, _keys([(release.pid, release.device)]))
        moments = [m for m in self.failure_moments if m is not None] + list(self.release_moments.values())
        self.second = SecondOom(moments, sites)
        sites.watchers.append(self.second)
        return self.second

    def _peaks(self) -> list[tuple[int, int, int]]:
        """Each process's peak so far (AllocatorSums reads it after the second look's batch)."""
        return [(s.pid, s.device, s.best_ts) for s in self.look.peaks if s.pid is not None and s.best_seq >= 0] \
            if self.look is not None else []

    def verdicts(self, quick, described, label: Callable[[int], str], final_live: dict,
                 cut_short: Callable[[dict], list]) -> Verdicts:
        """find_verdicts' Verdicts from the passes (`quick`: run_streamed's Analysis; `final_live`:
        the allocations never freed, EventFlow.live; `cut_short(open_by_pid)`: oom._cut_short)."""
        self.second.finish(final_live)
        preallocations = quick.reserved.preallocations
        allocators = self.sums.uses(quick.peaks, lambda p, d: self.kinds.get((p, d)), preallocations,
                                                 self.gpu_of, label)
        failures, probes = self._failed_calls(described)
        allocator_ooms, flushes = [], []
        for i, release in enumerate(self.releases):
            moment = self.release_moments.get(i)
            if moment is None:
                flushes.append(release)
                continue
            allocator_ooms.append(AllocatorOom(release=release, open_ranges=self.open_by_pid.get(release.pid, []),
                                               live_count=moment.count, live_at_release=described.allocations(
                                                   moment.largest, self.second.free_ts, moment)))
        oom = OutOfMemory(failures=failures, failed_count=self.calls.out_of_memory, probes=probes,
                          allocator_ooms=allocator_ooms, cache_flushes=flushes,
                          cut_short=cut_short(self.open_by_pid))
        found_caps = verdict_caps(preallocations, oom)
        diagnostics = (_oom_diagnostics(oom, label) + _reserved_diagnostics(allocators, preallocations)
                       + self._vmm_without_access(label))
        return Verdicts(oom=oom, reserved=ReservedMemory(allocators=allocators, preallocations=preallocations,
                                                        pools=quick.reserved.pools),
                        caps=memory_caps(quick.groups, self.total_memory, found_caps), peaks=quick.peaks,
                        diagnostics=diagnostics,
                        replaces=({"allocation_failed"} if oom.failures else set())
                        | ({"caching_allocator"} if allocators or preallocations else set()))

    def _failed_calls(self, described) -> tuple[list[OomFailure], list[Probe]]:
        """oom._failed_calls from the scan's failed calls, one more scan of the calls for their
        numbers and retries, and the live sets at the failures."""
        failed = self.calls.failed
        if failed.empty:
            return [], []
        paths = np.asarray(attribute_ranges(failed, self.ranges)[1], dtype=object)
        retry, number = _retries_and_numbers(self.calls, failed)
        failures, probes, failing = [], [], 0
        for i, (pid, tid, api, ts, code) in enumerate(failed[["pid", "tid", "api", "ts_ns", "return_value"]]
                                                      .itertuples(index=False)):  # failed calls: few, capped
            pid, tid, api, ts, code = int(pid), int(tid), str(api), int(ts), int(code)
            retried = int(retry[i]) if retry[i] >= 0 else None
            if code != OUT_OF_MEMORY:
                if retried is not None:
                    probes.append(Probe(pid=pid, tid=tid, api=api, time_ns=ts, return_value=code,
                                        error=error_name(api, code), nvtx_path=str(paths[i]), retried_after_ns=retried))
                continue
            if failing >= MAX_FAILURES:
                continue
            failures.append(self._failure(failing, pid, tid, api, ts, code, str(paths[i]), retried, int(number[i]),
                                          described))
            failing += 1
        return failures, probes

    def _failure(self, i: int, pid: int, tid: int, api: str, ts: int, code: int, path: str, retried: Optional[int],
                 number: int, described) -> OomFailure:
        device = self.failure_devices[i]
        gpu = self.gpu_of(pid, device) if device is not None else None
        total = self.total_memory(gpu)
        moment = self.failure_moments[i]
        process_live = gpu_live = None
        count, live = 0, []
        if moment is not None:
            count, live = moment.count, described.allocations(moment.largest, self.second.free_ts, moment)
            gpu_live, process_live = sum(moment.by_pid.values()), moment.by_pid.get(pid, 0)
        return OomFailure(pid=pid, tid=tid, api=api, time_ns=ts, return_value=code, error=error_name(api, code),
                          call_number=number, nvtx_path=path, device=device, gpu=gpu,
                          process_live_bytes=process_live, gpu_live_bytes=gpu_live, total_memory_bytes=total,
                          headroom_bytes=total - gpu_live if total and gpu_live is not None else None,
                          live_count=count, live_at_failure=live, retried_after_ns=retried)

    def _vmm_without_access(self, label: Callable[[int], str]) -> list[Diagnostic]:
        """verdicts._vmm_without_access from the scan's cuMemCreate calls and the maps counted."""
        if not self.calls.count:
            return []
        return vmm_without_access(dict(sorted(self.calls.created_by_pid.items())), self.maps.finish({}), label)


def _retries_and_numbers(calls, failed: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For each failed call: ns until the same API next succeeded on its thread within
    PROBE_RETRY_NS of its return (-1: not), and its number among its process's calls of that API
    (oom._retry_after, oom._failure's call_number), from one scan of the calls."""
    api = np.array([calls.api_names.index(a) for a in failed["api"]], "int64")
    pid, tid = failed["pid"].to_numpy().astype("int64"), failed["tid"].to_numpy().astype("int64")
    ts, end = failed["ts_ns"].to_numpy().astype("int64"), failed["end_ns"].to_numpy().astype("int64")
    next_start = np.full(len(failed), HIGH, "int64")
    before = np.zeros(len(failed), "int64")
    by_api = pd.DataFrame({"pid": pid, "api": api}).groupby(["pid", "api"]).indices
    by_thread = pd.DataFrame({"pid": pid, "tid": tid, "api": api}).groupby(["pid", "tid", "api"]).indices
    for _, real, _ in calls.read():  # every chunk of calls once
        if not len(real["ts"]):
            continue
        for (p, a), rows in by_api.items():  # the failed calls' processes and APIs: a few
            starts = np.sort(real["ts"][(real["pid"] == p) & (real["api"] == a)])
            before[rows] += np.searchsorted(starts, ts[rows], side="left")
        ok = real["return_value"] == 0
        for (p, t, a), rows in by_thread.items():
            starts = np.sort(real["ts"][ok & (real["pid"] == p) & (real["tid"] == t) & (real["api"] == a)])
            at = np.searchsorted(starts, end[rows], side="left")
            found = at < len(starts)
            next_start[rows[found]] = np.minimum(next_start[rows[found]], starts[at[found]])
    retry = np.where((next_start < HIGH) & (next_start <= end + PROBE_RETRY_NS), next_start - end, -1)
    return retry, before + 1


def _keys(pairs: list[tuple[int, int]]) -> np.ndarray:
    return pair_key(np.array([p for p, _ in pairs], "int64"), np.array([d for _, d in pairs], "int64"))
