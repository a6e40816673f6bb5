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
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

import numpy as np
import pandas as pd

from ..base.cuda_errors import OUT_OF_MEMORY, error_name
from ..engine import GpuOf, Reducer
from ..events.arrays import HIGH, one_pair_key, pair_key
from ..events.nvtx import attribute_ranges
from ..model import GPU_RESIDENT_KINDS
from .groups import batch_series
from .peak import live_at

if TYPE_CHECKING:
    from ..model.oom_found import CacheRelease, CutShort, OomFailure, Probe

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



def gave_up_inside(release: CacheRelease, opened: list[str]) -> bool:
    """Whether a release with nothing allocated after it is the allocator giving up: the process
    left NVTX ranges open (`opened`, outermost first), and the release came inside the innermost
    of them, on the thread that asked. Only ranges left open tell a death from an empty_cache()
    the process went on after (torch_emptycache_v25, no NVTX: a flush, its live bytes no cap);
    and an empty_cache() before the range that then failed is a flush too (torch_fraction_oom_v25:
    48 MiB released, then 'big request' opens and raises with nothing cached)."""
    return bool(opened) and opened[-1] in release.nvtx_path.split(" > ")


# --- failed calls ----------------------------------------------------------------------------

def failures_and_probes(failed: pd.DataFrame, ranges: pd.DataFrame, retry: np.ndarray, number: np.ndarray,
                        failure: Callable[..., OomFailure]) -> tuple[list[OomFailure], list[Probe]]:
    """The out-of-memory failures (the first MAX_FAILURES) and the probes among the failed calls
    (calls.CallOutcomes.failed), with each one's retry and number (retries_and_numbers);
    `failure(i, pid, tid, api, ts, code, nvtx_path, retried, number)` makes the i-th failure."""
    if failed.empty:
        return [], []
    paths = np.asarray(attribute_ranges(failed, ranges)[1], dtype=object)
    failures, probes = [], []
    for i, (pid, tid, api, ts, code) in enumerate(zip(*(failed[c].tolist() for c in
                                                        ("pid", "tid", "api", "ts_ns", "return_value")))):
        retried = int(retry[i]) if retry[i] >= 0 else None  # failed calls: few, capped
        if code != OUT_OF_MEMORY:
            if retried is not None:
                from ..model.oom_found import Probe  # made when found (model/oom_found.py)
                probes.append(Probe(pid=int(pid), tid=int(tid), api=str(api), time_ns=int(ts), return_value=int(code),
                                    error=error_name(str(api), int(code)), nvtx_path=str(paths[i]),
                                    retried_after_ns=retried))
        elif len(failures) < MAX_FAILURES:
            failures.append(failure(len(failures), int(pid), int(tid), str(api), int(ts), int(code), str(paths[i]),
                                    retried, int(number[i])))
    return failures, probes


def retries_and_numbers(chunks: Iterable[dict], api_names: Sequence[str],
                        failed: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For each failed call: ns until the same API next succeeded on its thread within
    PROBE_RETRY_NS of its return (-1: not), and its number among its process's calls of that API,
    from one read of the calls (`chunks`: their pid, tid, api codes into `api_names`, ts and
    return_value; the whole frame's calls as one)."""
    api = np.array([list(api_names).index(a) for a in failed["api"]], "int64")
    pid, tid = failed["pid"].to_numpy().astype("int64"), failed["tid"].to_numpy().astype("int64")
    ts, end = failed["ts_ns"].to_numpy().astype("int64"), failed["end_ns"].to_numpy().astype("int64")
    next_start = np.full(len(failed), HIGH, "int64")
    before = np.zeros(len(failed), "int64")
    by_api = pd.DataFrame({"pid": pid, "api": api}).groupby(["pid", "api"]).indices
    by_thread = pd.DataFrame({"pid": pid, "tid": tid, "api": api}).groupby(["pid", "tid", "api"]).indices
    for real in chunks:
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


def oom_calls(failed: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(pid, tid, time) of the failed calls (calls.CallOutcomes.failed) that ran out of memory, the
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


@dataclass
class Moment:
    """A moment whose live set OomLiveSets finds: right after the last event at or before `ts`
    (before it when `strict`), over the GPU-resident allocations of the pairs `members` (pair
    keys); then its allocations' `count`, live bytes per process and LIVE_LISTED largest rows."""

    ts: int
    strict: bool
    members: np.ndarray
    resolved: bool = False
    count: int = 0
    by_pid: dict = field(default_factory=dict)  # pid -> its live bytes
    largest: pd.DataFrame = field(default_factory=pd.DataFrame)  # batch_rows' columns


class OomLiveSets(Reducer):
    """The live sets at the moments of out of memory: each failed call's, on its GPU, and each
    allocator's last release, on its (process, device). They are known after the first look
    (which finds the devices, the allocators and their releases): `Facts.more["oom_moments"]`,
    given the pairs with GPU-resident events (collected only when `oom_calls` is not empty),
    makes the Moments between the looks; the second keeps the live set at each as the peaks keep
    theirs (peak.live_at); the flow's allocations.FreeTimes notes when their largest are freed.
    `finish` gives itself."""

    field = "oom_live"
    needs = ("oom_calls", "oom_moments")
    second_look = True

    def start(self, facts) -> None:
        super().start(facts)
        self.resident = [i for i, kind in enumerate(facts.kinds) if kind in GPU_RESIDENT_KINDS]
        self.wants_pairs = bool(facts.more.get("oom_calls"))
        self.pairs: set = set()
        self.moments: list[Moment] = []

    def add(self, b) -> None:
        if self.wants_pairs:
            resident = np.isin(b.kind, self.resident)
            self.pairs.update(pd.unique(pair_key(b.pid[resident], b.device[resident])).tolist())

    def between(self) -> None:
        self.moments = self.facts.more["oom_moments"](sorted(self.pairs))
        self.closed: list[pd.DataFrame] = []  # allocations never to be freed, of the batches so far

    def again(self, b) -> None:
        if not len(b) or not self.moments:
            return
        for moment in self.moments:
            cut = int(np.searchsorted(b.ts, moment.ts, side="left" if moment.strict else "right"))
            if not moment.resolved and cut < len(b):  # the moment is in this batch, or just before it
                self._resolve(moment, live_at(b, int(b.seq[cut - 1]) if cut else int(b.seq[0]) - 1, moment.members,
                                              self.resident, self.closed))
        if len(b.closed.get("seq", [])):
            self.closed.append(pd.DataFrame(b.closed))

    def finish(self, live: dict) -> "OomLiveSets":
        """Itself, the moments after the last event resolved with the allocations live at the end."""
        for moment in self.moments:
            if not moment.resolved:
                frame = pd.concat([pd.DataFrame(live)] + self.closed, ignore_index=True)
                keep = np.isin(frame["kind"].to_numpy(), self.resident) \
                    & np.isin(pair_key(frame["pid"].to_numpy(), frame["device"].to_numpy()), moment.members)
                self._resolve(moment, frame[keep].drop(columns="pool", errors="ignore")
                              .sort_values("seq", ignore_index=True))
        return self

    @staticmethod
    def _resolve(moment: Moment, live: pd.DataFrame) -> None:
        moment.resolved, moment.count = True, int(len(live))
        moment.by_pid = {int(k): int(v) for k, v in live.groupby("pid")["bytes"].sum().items()}
        moment.largest = live.iloc[np.argsort(-live["bytes"].to_numpy(), kind="stable")[:LIVE_LISTED]] \
            .reset_index(drop=True)


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

    def add(self, delta: np.ndarray, ts: np.ndarray, tid_of: Callable[[int], int]) -> None:
        """The own rows of one batch: their `delta` bytes and times; `tid_of(i)`: the thread of
        the i-th (asked of a burst's first free only)."""
        n = len(delta)
        if not n:
            return
        live = self.live + np.cumsum(delta)
        is_free = delta < 0
        # a burst: frees in a row, each within BURST_GAP_NS of the one before
        continues = np.empty(n, bool)
        continues[0] = is_free[0] and self.last_free and ts[0] - self.last_ts <= BURST_GAP_NS
        continues[1:] = is_free[1:] & is_free[:-1] & (np.diff(ts) <= BURST_GAP_NS)
        starts = np.flatnonzero(is_free & ~continues)
        # the open burst ends at this batch's first row that does not continue it
        if self.open is not None:
            stop = int(np.argmin(continues)) if not continues.all() else n
            if stop:
                self.open[4] += stop
                self.open[5] += int(-delta[:stop].sum())
                self.open[6:9] = [self.rows + stop - 1, int(ts[stop - 1]), int(live[stop - 1])]
            if stop < n:
                self._close()
        # new bursts: each start and the rows that continue it, up to its last free (the last
        # frees not continued; the first of them may end the open burst)
        if len(starts):
            last = is_free.copy()  # the frees the next row does not continue
            last[:-1] &= ~continues[1:]
            ends = np.flatnonzero(last)[-len(starts):]
            sizes = ends - starts + 1
            # the bursts that end here while there is room to keep them, and the run still open
            room = max(MAX_RELEASES - len(self.found), 0)
            ending = np.flatnonzero((sizes >= BURST_MIN_BLOCKS) & (ends < n - 1))[:room].tolist()
            for k in ending + ([len(starts) - 1] if ends[-1] == n - 1 else []):
                a, z = int(starts[k]), int(ends[k])
                self.open = [self.rows + a, int(ts[a]), tid_of(a), int(live[a] - delta[a]), int(sizes[k]),
                             int(-delta[a:z + 1].sum()), self.rows + z, int(ts[z]), int(live[z])]
                if z < n - 1:
                    self._close()
        grows = delta > 0
        if grows.any():
            self.last_alloc = self.rows + n - 1 - int(np.argmax(grows[::-1]))
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
        if self.release_codes is None:
            return
        # each pair's device rows from the batch's groups (made once for every reducer; a mask
        # per pair over every device row and a pd.unique of their pairs took 0.4 s at 1e7 events)
        for (pid, device), rows, _ in batch_series(b, [self.device]):
            delta = b.delta[rows]
            grows, api = delta > 0, b.calls["api"][rows]
            for name, code in zip(RELEASE_APIS, self.release_codes):
                own = rows[grows | (api == code)]  # its allocations and this API's frees
                self.bursts.setdefault((one_pair_key(pid, device), name), Bursts()).add(
                    b.delta[own], b.ts[own], lambda i, own=own: int(b.calls["tid"][own[i]]))

    def finish(self, live: dict) -> "ReleaseBursts":
        """Itself, its open bursts closed (so far, when asked before the last batch)."""
        for bursts in self.bursts.values():
            bursts.finish()
        return self

    def releases(self, caching: dict[tuple[int, int], str], gpu_of: GpuOf, ranges: pd.DataFrame) -> list[CacheRelease]:
        """The bursts of the pairs a caching allocator manages (`caching`: its kind), each named
        by the NVTX path of its first free (`ranges`: the NVTX ranges)."""
        taken: list[tuple[int, int, Bursts, list]] = []  # (pid, device, its bursts, those kept)
        count = 0
        for (pid, device), kind in sorted(caching.items()):
            bursts = self.bursts.get((one_pair_key(pid, device), _RELEASE_API.get(kind, "cudaFree")))
            if bursts is None or not bursts.found:
                continue
            taken.append((pid, device, bursts, bursts.found[:MAX_RELEASES - count]))
            count += len(taken[-1][3])
            if count >= MAX_RELEASES:
                break
        if not taken:
            return []
        # every first free's NVTX path at once: each lookup makes the paths of every range
        chosen = [(pid, b) for pid, _, _, kept in taken for b in kept]
        points = pd.DataFrame({"pid": np.array([pid for pid, _ in chosen], "int64"),
                               "tid": np.array([b[2] for _, b in chosen], "int64"),
                               "ts_ns": np.array([b[1] for _, b in chosen], "int64")})
        named = iter(np.asarray(attribute_ranges(points, ranges)[1], dtype=object).tolist())
        from ..model.oom_found import CacheRelease  # made when found (model/oom_found.py)
        found: list[CacheRelease] = []
        for pid, device, bursts, kept in taken:
            for (_, start_ns, _, before, blocks, released, end, end_ns, after), path in zip(kept, named):
                found.append(CacheRelease(
                    pid=pid, device=device, gpu=gpu_of(pid, device), start_ns=start_ns, end_ns=end_ns, blocks=blocks,
                    released_bytes=released, nvtx_path=str(path), live_before_bytes=before, live_after_bytes=after,
                    followed_by_allocation=bursts.last_alloc > end))
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

    def add(self, b) -> None:
        for (pid, _), mine, live in batch_series(b, self.resident, per_device=False):
            sums = self.sums.setdefault(int(pid), [0, 0, 0, np.iinfo("int64").min])
            live = sums[2] + live
            sums[:] = [sums[0] + len(mine), max(sums[1], int(b.ts[mine[-1]])), int(live[-1]),
                       max(sums[3], int(live.max()))]

    def between(self) -> None:
        self.tail = {pid: [0, 0, None] for pid in self.sums}

    def again(self, b) -> None:
        for (pid, _), mine, live in batch_series(b, self.resident, per_device=False):
            tail = self.tail[int(pid)]
            wanted = int(self.sums[int(pid)][0] * (1 - CLIMBING_TAIL))
            live = tail[1] + live
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
                from ..model.oom_found import CutShort  # made when found (model/oom_found.py)
                found.append(CutShort(pid=int(pid), last_event_ns=last, open_ranges=opened, climbing=climbing,
                                      end_live_bytes=end_live))
        return found
