"""Reserved versus used: which framework allocator holds a process's device memory, and how much.

nsys records what an allocator reserves from the driver (cudaMalloc segments, VMM maps, one
preallocated block), never what its tensors use inside. So the verdict is in plain words: these
bytes are reserved; growth per step is the signal.

PyTorch's caching allocator asks cudaMalloc only for segments of 2 MiB (its small pool), 20 MiB
(requests of 1-10 MiB) or a multiple of 2 MiB (larger ones); with `expandable_segments` it maps
2 MiB / 20 MiB pieces through the virtual-memory API, which nsys records at `cuMemSetAccess`.
Anything else a process allocates directly (a library's workspace, e.g. cuBLAS's 1 KiB + 128 KiB
+ 64 MiB made together on each thread that first calls it) is outside the allocator.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..events.arrays import previous_in_group
from ..model import AllocatorUse, Peak, Preallocation
from ..base.units import fmt_bytes, fmt_percent, fmt_time
from .timeline import Groups

MiB = 1 << 20
SEGMENT_ALIGN = 2 * MiB  # every caching-allocator segment is a multiple of this
SMALL_SEGMENT, LARGE_SEGMENT = 2 * MiB, 20 * MiB
# A library initializing allocates a few blocks in a row on one thread: odd sizes, then its
# workspace right after (cuBLAS: 1 KiB, 128 KiB, then 64 MiB 75 µs later on torch_leak_v25; the
# allocator's own 32 MiB segment 150 µs after that is not part of it).
LIBRARY_BURST_NS = 1_000_000
PREALLOCATION_SHARE = 0.25  # one block this large a share of the GPU is a preallocated pool
VMM_MAP_API = "cuMemSetAccess"
_DIRECT_APIS = ("cudaMalloc", "cuMemAlloc", VMM_MAP_API)

GpuOf = Callable[[int, int], Optional[int]]


def is_value(column: pd.Series, value: str) -> np.ndarray:
    """`column == value` for a categorical column, as a bool array: compares category codes,
    never turning millions of strings into Python objects (1.7 s at 1e6 events)."""
    categories = column.cat.categories
    if value not in categories:
        return np.zeros(len(column), bool)
    return column.cat.codes.to_numpy() == categories.get_loc(value)


def category_code(column: pd.Series, value: str) -> int:
    """The code of `value` in a categorical column, -2 (no row's code) when it is not a category."""
    categories = column.cat.categories
    return int(categories.get_loc(value)) if value in categories else -2


def outside_allocator(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """For one process's device allocation `rows` (in time order): whether each cannot be a
    caching-allocator segment: a size that is not a multiple of 2 MiB, or the allocation made next
    on the same thread within LIBRARY_BURST_NS after one (the library's workspace)."""
    if len(rows) == 0:
        return np.zeros(0, bool)
    size = events["bytes"].to_numpy()[rows]
    odd = size % SEGMENT_ALIGN != 0
    if not odd.any():
        return odd
    threads, names = pd.factorize(events["tid"].to_numpy()[rows])
    previous = previous_in_group(threads, len(names))  # the thread's allocation before each
    ts = events["ts_ns"].to_numpy()[rows]
    before = np.maximum(previous, 0)
    follows_odd = (previous >= 0) & odd[before] & (ts - ts[before] <= LIBRARY_BURST_NS)
    return odd | follows_odd


def recognize(size: np.ndarray, mapped: np.ndarray, outside: np.ndarray, is_python: bool) -> Optional[str]:
    """pytorch_caching | pytorch_expandable for one (process, device)'s device allocations (their
    sizes, whether each is a VMM map, whether each is outside the allocator), or None."""
    mapped_sizes = set(np.unique(size[mapped]).tolist())
    if mapped.sum() >= 3 and mapped_sizes <= {SMALL_SEGMENT, LARGE_SEGMENT} and LARGE_SEGMENT in mapped_sizes:
        return "pytorch_expandable"
    segments = size[~outside & ~mapped]
    if len(segments) < 3 or (segments % SEGMENT_ALIGN).any():
        return None
    if (segments == SMALL_SEGMENT).any() and ((segments == LARGE_SEGMENT).any() or is_python):
        return "pytorch_caching"
    return None


def allocator_use(events: pd.DataFrame, peaks: list[Peak], gpu_of: GpuOf, process_names: dict[int, str],
                  preallocations: list[Preallocation], label: Callable[[int], str],
                  grouped: Groups, xla: frozenset = frozenset()) -> list[AllocatorUse]:
    """Inside/outside the framework allocator, at each process's peak and at the end;
    `grouped`: the events' (process, device, kind) groups (timeline.group_events); `xla`: the
    processes that ran XLA (diagnostics.xla_pids), whose allocator is never called PyTorch's."""
    if events.empty:
        return []
    op_codes, in_pool, api_codes = events["op"].cat.codes.to_numpy(), events["pool"].to_numpy(), \
        events["api"].cat.codes.to_numpy()
    map_code = category_code(events["api"], VMM_MAP_API)
    prealloc_rows = {(p.pid, p.device): p for p in preallocations}
    peak_of = {(p.pid, p.device): p for p in peaks if p.pid is not None}
    result = []
    for (pid, device) in sorted(peak_of):  # a few (process, device) pairs; the rows are many
        rows = grouped.rows(("device",), pid, device)
        mine = rows[(op_codes[rows] == 0) & ~in_pool[rows]]  # its device allocations, pools' aside
        size = events["bytes"].to_numpy()[mine]
        if (pid, device) in prealloc_rows:
            block = prealloc_rows[(pid, device)]
            outside = ~((events["ts_ns"].to_numpy()[mine] == block.time_ns) & (size == block.bytes))
            kind = "xla_preallocation" if block.framework == "XLA" else "preallocation"
        elif pid in xla:  # XLA's allocator without its preallocation: not PyTorch's, whatever its sizes
            continue
        else:
            outside = outside_allocator(events, mine)
            is_python = "python" in process_names.get(pid, "").lower()
            mapped = api_codes[mine] == map_code
            kind = recognize(size, mapped, outside, is_python)
            if kind is None:
                continue
            if kind == "pytorch_caching":
                # NCCL's and other libraries' VMM maps are not the caching allocator's
                outside = outside | mapped
        peak = peak_of[(pid, device)]
        seq = int(np.searchsorted(events["ts_ns"].to_numpy(), peak.peak_time_ns, side="right")) - 1
        freed_at = events["partner"].to_numpy()[mine]
        inside_peak, outside_peak = _live_split(mine, freed_at, size, outside, seq)
        inside_end, outside_end = _live_split(mine, freed_at, size, outside, len(events) - 1)
        result.append(AllocatorUse(
            pid=pid, device=device, gpu=gpu_of(pid, device), allocator=kind,
            inside_at_peak_bytes=inside_peak, outside_at_peak_bytes=outside_peak, inside_end_bytes=inside_end,
            outside_end_bytes=outside_end, outside_allocations=int(outside.sum()),
            message=_message(kind, label(pid), gpu_of(pid, device), device, inside_peak, outside_peak,
                             int(outside.sum()))))
    return result


def _live_split(allocs: np.ndarray, freed_at: np.ndarray, size: np.ndarray, outside: np.ndarray,
                seq: int) -> tuple[int, int]:
    """Bytes of the allocations at rows `allocs` (freed at rows `freed_at`, -1 never; of `size`
    bytes) live right after row `seq`: (inside, outside)."""
    live = (allocs <= seq) & ((freed_at < 0) | (freed_at > seq))
    return int(size[live & ~outside].sum()), int(size[live & outside].sum())


_NAMES = {"pytorch_caching": "PyTorch's caching allocator",
          "pytorch_expandable": "PyTorch's caching allocator (expandable segments, through cuMemCreate/cuMemMap/"
                                "cuMemSetAccess)",
          "xla_preallocation": "XLA's allocator", "preallocation": "a preallocating allocator"}


def _message(kind: str, who: str, gpu: Optional[int], device: int, inside: int, outside: int,
             outside_count: int) -> str:
    where = f"GPU {gpu}" if gpu is not None else f"device {device}"
    text = (f"{who} on {where}: {_NAMES[kind]} held {fmt_bytes(inside)} at the peak. These bytes are what "
            "it reserved from the driver; its tensors use less, and what they use is not in an nsys trace")
    if kind.startswith("pytorch"):
        text += (" (torch.cuda.memory_allocated() tells). 'Never freed' at exit is its cache, not a leak; "
                 "growth from step to step is the signal")
    if outside_count:
        text += (f". {fmt_bytes(outside)} was allocated outside it ({outside_count} allocations: library "
                 "workspaces and buffers, such as cuBLAS's and NCCL's, made directly with cudaMalloc or the "
                 "virtual-memory API)")
    return text + "."


def find_preallocations(events: pd.DataFrame, ranges: pd.DataFrame, gpu_of: GpuOf,
                        total_memory: Callable[[Optional[int]], Optional[int]],
                        label: Callable[[int], str]) -> list[Preallocation]:
    """Single blocks of at least PREALLOCATION_SHARE of their GPU (the first per process and device)."""
    if events.empty:
        return []
    size = events["bytes"].to_numpy()
    big = np.flatnonzero((events["op"].cat.codes.to_numpy() == 0) & (events["kind"] == "device").to_numpy()
                         & (size >= 1 << 30))
    found, seen = [], set()
    for row in big.tolist():  # blocks of a GiB or more: a handful at most
        pid, device = int(events["pid"].iat[row]), int(events["device"].iat[row])
        gpu = gpu_of(pid, device)
        total = total_memory(gpu)
        if not total or size[row] < PREALLOCATION_SHARE * total or (pid, device) in seen:
            continue
        seen.add((pid, device))
        names = ranges["name"].to_numpy()[ranges["pid"].to_numpy() == pid] if not ranges.empty else []
        framework = "XLA" if any(str(n).startswith("Xla") for n in names) else ""
        found.append(Preallocation(
            pid=pid, device=device, gpu=gpu, bytes=int(size[row]), time_ns=int(events["ts_ns"].iat[row]),
            api=str(events["api"].iat[row]), share_of_gpu=float(size[row] / total), framework=framework,
            message=_prealloc_message(label(pid), gpu, int(size[row]), float(size[row] / total),
                                      int(events["ts_ns"].iat[row]), framework)))
    return found


def _prealloc_message(who: str, gpu: Optional[int], size: int, share: float, ts: int, framework: str) -> str:
    what = "XLA (JAX) preallocated" if framework == "XLA" else "one block reserved"
    text = (f"{who}: {what} {fmt_bytes(size)} ({fmt_percent(share)} of GPU {gpu}) in one block at {fmt_time(ts)}. "
            "The trace shows this reservation, not the use inside it, so its peak is the reservation's size")
    if framework == "XLA":
        text += (". To see the real use, run with XLA_PYTHON_CLIENT_PREALLOCATE=false (allocate on demand) or "
                 "XLA_PYTHON_CLIENT_ALLOCATOR=platform (every buffer its own cudaMalloc/cudaFree, so the "
                 "growth per step shows as for PyTorch)")
    return text + "."
