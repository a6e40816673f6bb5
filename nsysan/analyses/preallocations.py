"""Preallocated pools: one block of at least PREALLOCATION_SHARE of its GPU, the first such block
of a process's device (XLA's allocator takes 75% of the GPU at start). `BigBlocks` keeps the
device allocations of a GiB or more (a handful) on both paths; `preallocated` picks the pools
among them, and `find_preallocations` says what each one is, from the rows described."""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import pandas as pd

from ..base.units import fmt_bytes, fmt_percent, fmt_time
from ..engine import GpuOf, Reducer, TotalMemory
from ..events.arrays import pair_key
from ..events.batch import batch_rows, no_rows
from ..model import Preallocation

PREALLOCATION_SHARE = 0.25  # one block this large a share of the GPU is a preallocated pool
BIG_BLOCK = 1 << 30  # no GPU has 4 GiB or less: a pool is at least a GiB



class BigBlocks(Reducer):
    """The device allocations of BIG_BLOCK bytes or more, in time order (batch_rows' columns)."""

    field = "big_blocks"

    def start(self, facts) -> None:
        super().start(facts)
        self.device = list(facts.kinds).index("device") if "device" in facts.kinds else -2
        self.found: list[pd.DataFrame] = []

    def add(self, b) -> None:
        big = np.flatnonzero(b.is_alloc & (b.kind == self.device) & (b.bytes >= BIG_BLOCK))
        if len(big):
            self.found.append(batch_rows(b, big))

    def finish(self, live: dict) -> pd.DataFrame:
        return pd.concat(self.found, ignore_index=True) if self.found else no_rows()


def preallocated(blocks: pd.DataFrame, gpu_of: GpuOf, total_memory: TotalMemory) -> pd.DataFrame:
    """The rows of `blocks` (BigBlocks') that are preallocated pools: the first of each process
    and device of at least PREALLOCATION_SHARE of its GPU's memory."""
    chosen, seen = [], set()
    for i, (pid, device, size) in enumerate(zip(*(blocks[c].tolist() for c in ("pid", "device", "bytes")))):
        total = total_memory(gpu_of(pid, device))  # a handful of blocks
        if total and size >= PREALLOCATION_SHARE * total and (pid, device) not in seen:
            seen.add((pid, device))
            chosen.append(i)
    return blocks.iloc[chosen]


def block_keys(blocks: pd.DataFrame) -> dict[int, tuple[int, int]]:
    """pair key -> (time, bytes) of each preallocated block (`preallocated`'s rows), as
    allocator.AllocatorSums' facts name them (`allocator_blocks`)."""
    keys = pair_key(blocks["pid"].to_numpy().astype("int64"), blocks["device"].to_numpy().astype("int64"))
    return {int(k): (int(ts), int(size)) for k, ts, size in zip(keys, blocks["ts"], blocks["bytes"])}


def find_preallocations(events: pd.DataFrame, ranges: pd.DataFrame, gpu_of: GpuOf, total_memory: TotalMemory,
                        label: Callable[[int], str]) -> list[Preallocation]:
    """The Preallocations of `events`, the preallocated blocks as an events frame (the whole frame's
    rows of them, or the streamed flow's described); XLA's when its process has XLA's NVTX ranges."""
    found = []
    for pid, device, size, ts, api in zip(*(events[c].tolist() for c in ("pid", "device", "bytes", "ts_ns", "api"))):
        gpu = gpu_of(pid, device)
        share = float(size / total_memory(gpu))
        names = ranges["name"].to_numpy()[ranges["pid"].to_numpy() == pid] if not ranges.empty else []
        framework = "XLA" if any(str(n).startswith("Xla") for n in names) else ""
        found.append(Preallocation(pid=int(pid), device=int(device), gpu=gpu, bytes=int(size), time_ns=int(ts),
                                   api=str(api), share_of_gpu=share, framework=framework,
                                   message=_message(label(pid), gpu, int(size), share, int(ts), framework)))
    return found


def _message(who: str, gpu: Optional[int], size: int, share: float, ts: int, framework: str) -> str:
    what = "XLA (JAX) preallocated" if framework == "XLA" else "one block reserved"
    text = (f"{who}: {what} {fmt_bytes(size)} ({fmt_percent(share)} of GPU {gpu}) in one block at {fmt_time(ts)}. "
            "The trace shows this reservation, not the use inside it, so its peak is the reservation's size")
    if framework == "XLA":
        text += (". To see the real use, run with XLA_PYTHON_CLIENT_PREALLOCATE=false (allocate on demand) or "
                 "XLA_PYTHON_CLIENT_ALLOCATOR=platform (every buffer its own cudaMalloc/cudaFree, so the "
                 "growth per step shows as for PyTorch)")
    return text + "."
