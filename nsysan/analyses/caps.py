"""Caps: the most memory each process could get on each GPU, from what the capture shows."""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from ..model import GPU_RESIDENT_KINDS, GroupSummary, MemoryCap


def memory_caps(groups: list[GroupSummary], total_memory: Callable[[Optional[int]], Optional[int]],
                found: Iterable[MemoryCap] = ()) -> list[MemoryCap]:
    """A gpu_total cap for every (process, device) holding GPU-resident memory on a GPU of known
    size, followed by the caps other analyses found (XLA preallocation, allocator OOM)."""
    caps, seen = [], set()
    for group in groups:
        total = total_memory(group.gpu)
        key = (group.pid, group.device)
        if group.kind in GPU_RESIDENT_KINDS and total and key not in seen:
            seen.add(key)
            caps.append(MemoryCap(pid=group.pid, device=group.device, gpu=group.gpu, cap_bytes=int(total),
                                  source="gpu_total",
                                  note="the GPU's memory; the CUDA context and kernel images take part of it "
                                       "and are not in the trace"))
    return caps + list(found)
