"""Out of memory: failed calls and what held the GPU then, probes, allocator OOMs, runs cut short.

Three ways a run runs out of memory show in a trace:
- a memory call fails (returnValue 2): the live set on its GPU at that moment is the answer;
- a framework allocator refuses by itself (PyTorch under set_per_process_memory_fraction, or
  when its retry after freeing its cache still fails): no call fails; the allocator gives its
  cached blocks back to the driver in one burst, then nothing more is allocated and the NVTX
  ranges open at that moment never close;
- the capture simply ends while the process was working (ranges left open, memory climbing).
A burst of frees counts as an allocator OOM only when the process's NVTX ranges were left open:
without NVTX it can't be told from an empty_cache() (the program's log, `--log`, tells).
A failed call that is retried successfully at once is a probe (PyTorch's expandable segments try
cuMemCreate with a handle type the system refuses, 800, then again without it), not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..base.cuda_errors import OUT_OF_MEMORY, error_name
from ..engine import Reducer
from ..events.arrays import distinct_pairs, pair_key
from ..events.nvtx import attribute_ranges
from ..model import GPU_RESIDENT_KINDS, Allocation, AllocatorOom, CacheRelease, CutShort, OomFailure, OutOfMemory, \
    Probe

# "retried at once": the same API succeeds on the thread within 10 ms after the failed call
# returned (torch_expandable_v25's failing cuMemCreate itself takes 18.6 ms; the retry comes 21 µs
# after it)
PROBE_RETRY_NS = 10_000_000
BURST_GAP_NS = 5_000_000  # frees of one release burst follow each other within 5 ms
BURST_MIN_BLOCKS = 3
MAX_FAILURES = 20
MAX_RELEASES = 200
LIVE_LISTED = 20
OPEN_END_NS = np.iinfo("int64").max // 4  # an NVTX range still open at the end (see events.read)
CLIMBING_TAIL = 0.25  # "still climbing": live bytes rose over the last quarter of the process's events...
NEAR_END_NS = 100_000_000  # ...the last of which is within 100 ms of the end of the capture

ToAllocations = Callable[[pd.DataFrame], list[Allocation]]
GpuOf = Callable[[int, int], Optional[int]]


def find_out_of_memory(events: pd.DataFrame, calls: pd.DataFrame, ranges: pd.DataFrame, gpu_of: GpuOf,
                       total_memory: Callable[[Optional[int]], Optional[int]], to_allocations: ToAllocations,
                       releases: list[CacheRelease], devices: list[Optional[int]], end_ns: int,
                       duration_ns: Optional[int], cut: CutShortSums) -> OutOfMemory:
    """Every out-of-memory verdict of one capture. `releases`: the bursts of frees of the
    (pid, device) pairs a caching allocator manages (ReleaseBursts.releases); `devices`: the device of
    each call of oom_calls (FailureDevices). `end_ns` is the end of the capture's data, `duration_ns`
    the session's recorded length (where nsys ends the ranges it found open); `cut`: what
    tells a process cut short (CutShortSums)."""
    failures, probes, failed_count = _failed_calls(events, calls, ranges, gpu_of, total_memory, to_allocations,
                                                   devices)
    open_by_pid = _open_ranges(ranges, duration_ns or OPEN_END_NS)
    allocator_ooms, flushes = [], []
    for release in releases:
        if release.followed_by_allocation:
            flushes.append(release)
            continue
        opened = open_by_pid.get(release.pid, [])
        if gave_up_inside(release, opened):
            seq = int(np.searchsorted(events["ts_ns"].to_numpy(), release.start_ns, side="left")) - 1
            count, live = _live_set(events, seq, _pair_rows(events, release.pid, release.device), to_allocations)
            allocator_ooms.append(AllocatorOom(release=release, open_ranges=opened, live_count=count,
                                               live_at_release=live))
        else:  # every range closed: an empty_cache() before a normal exit
            flushes.append(release)
    return OutOfMemory(failures=failures, failed_count=failed_count, probes=probes, allocator_ooms=allocator_ooms, cache_flushes=flushes,
                       cut_short=cut.judged(open_by_pid, end_ns))


def gave_up_inside(release: CacheRelease, opened: list[str]) -> bool:
    """Whether a release with nothing allocated after it is the allocator giving up: the process
    left NVTX ranges open (`opened`, outermost first), and the release came inside the innermost
    of them, on the thread that asked. Only ranges left open tell a death from an empty_cache()
    the process went on after (torch_emptycache_v25, no NVTX: a flush, its live bytes no cap);
    and an empty_cache() before the range that then failed is a flush too (torch_fraction_oom_v25:
    48 MiB released, then 'big request' opens and raises with nothing cached)."""
    return bool(opened) and opened[-1] in release.nvtx_path.split(" > ")


# --- failed calls ----------------------------------------------------------------------------

def _failed_calls(events: pd.DataFrame, calls: pd.DataFrame, ranges: pd.DataFrame, gpu_of: GpuOf,
                  total_memory: Callable[[Optional[int]], Optional[int]],
                  to_allocations: ToAllocations,
                  devices: list[Optional[int]]) -> tuple[list[OomFailure], list[Probe], int]:
    if calls.empty:
        return [], [], 0
    failed_mask = ((calls["return_value"] != 0) & (calls["family"] != "info")).to_numpy()
    if not failed_mask.any():
        return [], [], 0
    failed_count = int((calls["return_value"].to_numpy()[failed_mask] == OUT_OF_MEMORY).sum())
    failed = calls[failed_mask].head(1000)
    _, paths = attribute_ranges(failed, ranges)
    # the successful calls of the failed ones' threads and APIs, as sorted start times per group
    same = ((calls["return_value"] == 0) & calls["api"].isin(failed["api"].unique())
            & calls["tid"].isin(failed["tid"].unique())).to_numpy()
    ok = calls[same]
    names = ok["api"].cat.categories
    ok_starts = {(pid, tid, str(names[code])): np.sort(group.to_numpy()) for (pid, tid, code), group in
                 ok.groupby([ok["pid"].to_numpy(), ok["tid"].to_numpy(), ok["api"].cat.codes.to_numpy()])["ts_ns"]}
    failures, probes = [], []
    for (_, call), path in zip(failed.iterrows(), np.asarray(paths)):  # failed calls: few, capped
        pid, tid, api, ts, code = int(call.pid), int(call.tid), str(call.api), int(call.ts_ns), int(call.return_value)
        retry = _retry_after(ok_starts.get((pid, tid, api)), int(call.end_ns))
        if code != OUT_OF_MEMORY:
            if retry is not None:
                probes.append(Probe(pid=pid, tid=tid, api=api, time_ns=ts, return_value=code,
                                    error=error_name(api, code), nvtx_path=str(path), retried_after_ns=retry))
            continue
        if len(failures) >= MAX_FAILURES:
            continue
        failures.append(_failure(events, calls, pid, tid, api, ts, code, str(path), retry, gpu_of, total_memory,
                                 to_allocations, devices[len(failures)]))
    return failures, probes, failed_count


def _retry_after(starts: Optional[np.ndarray], ts: int) -> Optional[int]:
    """ns from `ts` (the failed call's return) until the same API next succeeded on that thread
    (`starts`: its successful calls' start times, sorted), if within PROBE_RETRY_NS."""
    if starts is None:
        return None
    at = int(np.searchsorted(starts, ts, side="left"))
    if at < len(starts) and starts[at] <= ts + PROBE_RETRY_NS:
        return int(starts[at] - ts)
    return None


def _failure(events: pd.DataFrame, calls: pd.DataFrame, pid: int, tid: int, api: str, ts: int, code: int,
             path: str, retry: Optional[int], gpu_of: GpuOf, total_memory: Callable[[Optional[int]], Optional[int]],
             to_allocations: ToAllocations, device: Optional[int]) -> OomFailure:
    same_api = calls["ts_ns"].to_numpy()[((calls["pid"] == pid) & (calls["api"] == api)).to_numpy()]
    call_number = int((same_api < ts).sum()) + 1
    gpu = gpu_of(pid, device) if device is not None else None
    total = total_memory(gpu)
    process_live = gpu_live = None
    count, live = 0, []
    if not events.empty and device is not None:
        seq = int(np.searchsorted(events["ts_ns"].to_numpy(), ts, side="right")) - 1
        on_gpu = _gpu_rows(events, gpu, pid, device, gpu_of)
        count, live = _live_set(events, seq, on_gpu, to_allocations)
        sizes = _live_bytes_by_pid(events, seq, on_gpu)
        gpu_live, process_live = sum(sizes.values()), sizes.get(pid, 0)
    return OomFailure(pid=pid, tid=tid, api=api, time_ns=ts, return_value=code, error=error_name(api, code),
                      call_number=call_number, nvtx_path=path, device=device, gpu=gpu,
                      process_live_bytes=process_live, gpu_live_bytes=gpu_live, total_memory_bytes=total,
                      headroom_bytes=total - gpu_live if total and gpu_live is not None else None,
                      live_count=count, live_at_failure=live, retried_after_ns=retry)


def oom_calls(failed: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(pid, tid, time) of the failed calls (calls.failed_call_rows) that ran out of memory, the
    first MAX_FAILURES: the failures listed, whose devices FailureDevices finds."""
    if failed.empty:
        return []
    rows = failed[(failed["return_value"] == OUT_OF_MEMORY).to_numpy()].head(MAX_FAILURES)
    return list(zip(*(rows[c].astype("int64").tolist() for c in ("pid", "tid", "ts_ns")))) if len(rows) else []


class FailureDevices(Reducer):
    """The device each out-of-memory call most likely targeted (the API row has none): the device
    of its thread's latest memory event at or before it, else its process's first event's (None:
    the process has no memory event). Facts: `oom_calls` (oom_calls)."""

    field = "failure_devices"
    needs = ("oom_calls",)

    def start(self, facts) -> None:
        super().start(facts)
        self.calls = facts.more.get("oom_calls") or []
        self.thread_device = [-1] * len(self.calls)  # of its thread's latest event so far
        self.first_device: dict[int, int] = {}  # pid -> the device of its first event (pids that failed)

    def add(self, b) -> None:
        for i, (pid, thread, ts) in enumerate(self.calls):  # a few failing calls
            mine = np.flatnonzero(b.pid == pid)
            if len(mine) and pid not in self.first_device:
                self.first_device[pid] = int(b.device[mine[0]])
            before = mine[(b.calls["tid"][mine] == thread) & (b.ts[mine] <= ts)]
            if len(before):
                self.thread_device[i] = int(b.device[before[-1]])

    def finish(self, live: dict) -> list[Optional[int]]:
        return [device if device >= 0 else self.first_device.get(pid)
                for device, (pid, _, _) in zip(self.thread_device, self.calls)]


def _gpu_rows(events: pd.DataFrame, gpu: Optional[int], pid: int, device: int, gpu_of: GpuOf) -> np.ndarray:
    """Rows of GPU-resident memory on that GPU, every process (only pid's device if the GPU is unknown)."""
    resident = events["kind"].isin(GPU_RESIDENT_KINDS).to_numpy()
    pids, devices = events["pid"].to_numpy(), events["device"].to_numpy()
    if gpu is None:
        return np.flatnonzero(resident & (pids == pid) & (devices == device))
    packed = distinct_pairs(pids[resident], devices[resident], 16, 0xFFFF)
    members = [(p >> 16, p & 0xFFFF) for p in packed.tolist() if gpu_of(p >> 16, p & 0xFFFF) == gpu]
    on_gpu = np.zeros(len(events), bool)
    for p, d in members:
        on_gpu |= (pids == p) & (devices == d)
    return np.flatnonzero(resident & on_gpu)


def _pair_rows(events: pd.DataFrame, pid: int, device: int) -> np.ndarray:
    resident = events["kind"].isin(GPU_RESIDENT_KINDS).to_numpy()
    return np.flatnonzero(resident & (events["pid"] == pid).to_numpy() & (events["device"] == device).to_numpy())


def _live_rows(events: pd.DataFrame, seq: int, rows: np.ndarray) -> np.ndarray:
    """Allocations among `rows` live right after event row `seq`."""
    is_alloc = events["op"].cat.codes.to_numpy()[rows] == 0
    partner = events["partner"].to_numpy()[rows]
    return rows[is_alloc & (rows <= seq) & ((partner < 0) | (partner > seq))]


def _live_set(events: pd.DataFrame, seq: int, rows: np.ndarray,
              to_allocations: ToAllocations) -> tuple[int, list[Allocation]]:
    live = _live_rows(events, seq, rows)
    sizes = events["bytes"].to_numpy()[live]
    largest = live[np.argsort(-sizes, kind="stable")[:LIVE_LISTED]]
    return int(len(live)), to_allocations(events.iloc[largest])


def _live_bytes_by_pid(events: pd.DataFrame, seq: int, rows: np.ndarray) -> dict[int, int]:
    live = _live_rows(events, seq, rows)
    frame = pd.DataFrame({"pid": events["pid"].to_numpy()[live], "bytes": events["bytes"].to_numpy()[live]})
    return {int(k): int(v) for k, v in frame.groupby("pid")["bytes"].sum().items()}


# --- cache releases --------------------------------------------------------------------------

# The call a caching allocator gives a segment back with; other frees on the device (NCCL's
# cuMemUnmap at ncclCommDestroy, on ddp_leak_v25) are not its own.
_RELEASE_API = {"pytorch_caching": "cudaFree", "pytorch_expandable": "cuMemUnmap"}  # else cudaFree
RELEASE_APIS = ("cudaFree", "cuMemUnmap")


@dataclass
class Bursts:
    """The bursts of frees of one (pair, release API), batch by batch: the running live bytes of
    its own rows (allocations and that API's frees), the burst still open, and the first
    MAX_RELEASES bursts of BURST_MIN_BLOCKS frees or more."""

    live: int = 0
    rows: int = 0  # own rows so far
    last_free: bool = False
    last_ts: int = 0
    last_alloc: int = -1  # own row number of the last allocation
    open: Optional[list] = None  # [start row, start ts, tid, before, blocks, released, end row, end ts, after]
    found: list = field(default_factory=list)

    def add(self, delta: np.ndarray, ts: np.ndarray, tid: np.ndarray) -> None:
        n = len(delta)
        if not n:
            return
        number = self.rows + np.arange(n)
        live = self.live + np.cumsum(delta)
        is_free = delta < 0
        # a burst: frees in a row, each within BURST_GAP_NS of the one before
        prev_free = np.concatenate([[self.last_free], is_free[:-1]])
        prev_ts = np.concatenate([[self.last_ts], ts[:-1]])
        continues = is_free & prev_free & (ts - prev_ts <= BURST_GAP_NS)
        starts = np.flatnonzero(is_free & ~continues)
        # the open burst ends at this batch's first row that does not continue it
        if self.open is not None:
            stop = int(np.argmin(continues)) if not continues.all() else n
            if stop:
                self.open[4] += stop
                self.open[5] += int(-delta[:stop].sum())
                self.open[6:9] = [int(number[stop - 1]), int(ts[stop - 1]), int(live[stop - 1])]
            if stop < n:
                self._close()
        # new bursts: each start and the rows that continue it
        if len(starts):
            run_of = np.cumsum(is_free & ~continues) - 1
            in_run = is_free & (run_of >= 0)
            sizes = np.bincount(run_of[in_run], minlength=len(starts))
            ends = starts + sizes - 1
            # the bursts that end here while there is room to keep them, and the run still open
            room = max(MAX_RELEASES - len(self.found), 0)
            ending = np.flatnonzero((sizes >= BURST_MIN_BLOCKS) & (ends < n - 1))[:room].tolist()
            for k in ending + ([len(starts) - 1] if ends[-1] == n - 1 else []):
                a, z = int(starts[k]), int(ends[k])
                self.open = [int(number[a]), int(ts[a]), int(tid[a]), int(live[a] - delta[a]), int(sizes[k]),
                             int(-delta[a:z + 1].sum()),
                             int(number[z]), int(ts[z]), int(live[z])]
                if z < n - 1:
                    self._close()
        allocs = np.flatnonzero(delta > 0)
        if len(allocs):
            self.last_alloc = int(number[allocs[-1]])
        self.live, self.rows = int(live[-1]), self.rows + n
        self.last_free, self.last_ts = bool(is_free[-1]), int(ts[-1])

    def finish(self) -> None:
        if self.open is not None:
            self._close()

    def _close(self) -> None:
        if self.open[4] >= BURST_MIN_BLOCKS and len(self.found) < MAX_RELEASES:
            self.found.append(self.open)
        self.open = None


class ReleaseBursts(Reducer):
    """Bursts of frees by a caching allocator: BURST_MIN_BLOCKS or more matched frees in a row on
    one (process, device), no allocation between them, each within BURST_GAP_NS of the last; kept
    per call an allocator releases with (RELEASE_APIS), since which allocator manages a pair is
    known only after the events (allocator.AllocatorSums). `releases` makes the CacheRelease list.

    Facts: `api_names` (the names of the batches' API codes; without them, as --quick reads no
    calls, nothing is kept)."""

    field = "cache_bursts"
    needs = ("api_names",)

    def start(self, facts) -> None:
        super().start(facts)
        names = facts.more.get("api_names")
        self.release_codes = None if names is None else [names.index(a) if a in names else -2 for a in RELEASE_APIS]
        self.bursts: dict[tuple[int, str], Bursts] = {}
        self.device = list(facts.kinds).index("device") if "device" in facts.kinds else -2

    def add(self, b) -> None:
        device = np.flatnonzero(b.kind == self.device) if self.release_codes is not None else []
        if not len(device):
            return
        pairs = pair_key(b.pid[device], b.device[device])
        api = b.calls["api"][device]
        for key in pd.unique(pairs).tolist():  # a few (process, device) pairs
            mine = device[pairs == key]
            for name, code in zip(RELEASE_APIS, self.release_codes):
                own = mine[(b.delta[mine] > 0) | (api[pairs == key] == code)]
                self.bursts.setdefault((key, name), Bursts()).add(b.delta[own], b.ts[own],
                                                                  b.calls["tid"][own].astype("int64"))

    def finish(self, live: dict) -> "ReleaseBursts":
        """Itself, its open bursts closed (so far, when asked before the last batch)."""
        for bursts in self.bursts.values():
            bursts.finish()
        return self

    def releases(self, caching: dict[tuple[int, int], str], gpu_of: GpuOf, ranges: pd.DataFrame) -> list[CacheRelease]:
        """The bursts of the pairs a caching allocator manages (`caching`: its kind), each named
        by the NVTX path of its first free (`ranges`: the NVTX ranges)."""
        found: list[CacheRelease] = []
        for (pid, device), kind in sorted(caching.items()):
            bursts = self.bursts.get((int(pair_key(np.array([pid]), np.array([device]))[0]),
                                      _RELEASE_API.get(kind, "cudaFree")))
            if bursts is None or not bursts.found:
                continue
            chosen = bursts.found[:MAX_RELEASES - len(found)]
            points = pd.DataFrame({"pid": np.full(len(chosen), pid, "int64"),
                                   "tid": np.array([b[2] for b in chosen], "int64"),
                                   "ts_ns": np.array([b[1] for b in chosen], "int64")})
            named = np.asarray(attribute_ranges(points, ranges)[1], dtype=object)
            for (_, start_ns, _, before, blocks, released, end, end_ns, after), path in zip(chosen, named):
                found.append(CacheRelease(
                    pid=pid, device=device, gpu=gpu_of(pid, device), start_ns=start_ns, end_ns=end_ns, blocks=blocks,
                    released_bytes=released, nvtx_path=str(path), live_before_bytes=before, live_after_bytes=after,
                    followed_by_allocation=bursts.last_alloc > end))
            if len(found) >= MAX_RELEASES:
                break
        return found


# --- ranges left open, runs cut short --------------------------------------------------------

def _open_ranges(ranges: pd.DataFrame, end_ns: int) -> dict[int, list[str]]:
    """pid -> names of its NVTX ranges never closed, outermost (earliest) first. nsys closes a
    range left open at the end of the session (torch_oom_v25: `step 5` and `hoard` end at the
    capture's last ns); older exports leave its end NULL."""
    if ranges.empty:
        return {}
    still_open = ranges[(ranges["end_ns"].to_numpy() >= end_ns)]
    still_open = still_open.sort_values(["pid", "depth", "start_ns"], kind="stable")
    return {int(pid): [str(n) for n in group["name"]] for pid, group in still_open.groupby("pid", sort=True)}


class CutShortSums(Reducer):
    """What tells a process cut short, over its GPU-resident events: their count, the last one's
    time, the live bytes at the end and at their highest (the first look), and the live bytes
    after the first (1 - CLIMBING_TAIL) of them (the second, the count known). `judged` makes the
    CutShort list."""

    field = "cut_short"
    second_look = True

    def start(self, facts) -> None:
        super().start(facts)
        self.resident = [i for i, kind in enumerate(facts.kinds) if kind in GPU_RESIDENT_KINDS]
        self.sums: dict[int, list[int]] = {}  # pid -> [events, last time, live at the end, highest]
        self.tail: dict[int, list] = {}  # pid -> [events seen, live bytes so far, live at the tail's start]

    def _mine(self, b):
        """(pid, its resident rows) of the batch's processes (a few)."""
        rows = np.flatnonzero(np.isin(b.kind, self.resident))
        pids = b.pid[rows]
        return [(pid, rows[pids == pid]) for pid in pd.unique(pids).tolist()]

    def add(self, b) -> None:
        for pid, mine in self._mine(b):
            sums = self.sums.setdefault(int(pid), [0, 0, 0, np.iinfo("int64").min])
            live = sums[2] + np.cumsum(b.delta[mine])
            sums[:] = [sums[0] + len(mine), max(sums[1], int(b.ts[mine[-1]])), int(live[-1]),
                       max(sums[3], int(live.max()))]

    def between(self) -> None:
        self.tail = {pid: [0, 0, None] for pid in self.sums}

    def again(self, b) -> None:
        for pid, mine in self._mine(b):
            tail = self.tail[int(pid)]
            wanted = int(self.sums[int(pid)][0] * (1 - CLIMBING_TAIL))
            live = tail[1] + np.cumsum(b.delta[mine])
            if tail[0] <= wanted < tail[0] + len(mine):
                tail[2] = int(live[wanted - tail[0]])
            tail[:2] = [tail[0] + len(mine), int(live[-1])]

    def finish(self, live: dict) -> "CutShortSums":
        return self

    def judged(self, open_by_pid: dict[int, list[str]], end_ns: int) -> list[CutShort]:
        """Processes whose capture ends while they were working: NVTX ranges never closed
        (`open_by_pid`, _open_ranges), or GPU-resident live bytes at their highest at the end of
        the capture (`end_ns`) after rising over their last events (a process that finished has
        stopped allocating well before the capture ends: it still tears down, and nsys flushes)."""
        found = []
        for pid in sorted(set(open_by_pid) | set(self.sums)):
            opened = open_by_pid.get(pid, [])
            climbing, end_live, last = False, 0, 0
            if pid in self.sums:
                events, last, final, highest = self.sums[pid]
                near_end = end_ns - last <= NEAR_END_NS
                end_live = final if opened or near_end else 0
                tail = self.tail.get(pid, [0, 0, None])[2]
                climbing = bool(events >= 8 and end_live > 0 and end_live >= highest and tail is not None
                                and end_live > tail and near_end)
            if opened or climbing:
                found.append(CutShort(pid=int(pid), last_event_ns=last, open_ranges=opened, climbing=climbing,
                                      end_live_bytes=end_live))
        return found
