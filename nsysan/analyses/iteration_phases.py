"""Phases of the steps found from the kernels (analyses/iterations.py), where they can be told
apart without NVTX: PyTorch runs the backward pass on its autograd thread, so a step whose launches
come from a second thread has a `backward` (from the main thread's last launch before that
thread's first to the end of its last), a `forward` before it, and, when an optimizer kernel (`multi_tensor_apply`, Adam, SGD ...)
is launched after it, an `optimizer` from its end to the step's end. They are given as NVTX-like ranges
("iteration N > backward"), for the phase costs of analyses/phases.py in both paths; the events
keep their own NVTX attribution. A step launched from one thread (an evaluation) has none.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..events.columns import empty_ranges


def iteration_phases(pid: int, spans: pd.DataFrame, launches: pd.DataFrame, optimizer: np.ndarray) -> pd.DataFrame:
    """Ranges (events.columns.empty_ranges' columns, parents as rows of this frame) of each step
    with phases, and of its phases. `launches`: the process's, in time order; `optimizer`: per
    launch, whether it launched an optimizer kernel."""
    tid = launches["tid"].to_numpy()
    if not len(tid):
        return empty_ranges()
    main = pid if (tid == pid).any() else int(pd.Series(tid).mode().iloc[0])
    ts, end = launches["ts_ns"].to_numpy(), launches["end_ns"].to_numpy()
    first = np.searchsorted(ts, spans["start_ns"].to_numpy(), side="left")
    stop = np.searchsorted(ts, spans["end_ns"].to_numpy(), side="left")
    rows: list[tuple] = []
    for name, begin, finish, low, high in zip(spans["name"].tolist(), spans["start_ns"].tolist(),
                                              spans["end_ns"].tolist(), first.tolist(), stop.tolist()):
        other = low + np.flatnonzero(tid[low:high] != main)
        if not len(other):
            continue
        # the backward pass begins when the main thread hands over (the end of its last launch
        # before the autograd thread's first): the autograd thread allocates before it launches
        before = low + np.flatnonzero(tid[low:other[0]] == main)
        back_start = int(end[before[-1]]) if len(before) else int(ts[other[0]])
        back_end = int(end[other[-1]])
        parent = len(rows)
        rows.append((name, begin, finish, 1, -1))
        rows.append(("forward", begin, back_start, 2, parent))
        rows.append(("backward", back_start, back_end, 2, parent))
        after = low + np.flatnonzero(optimizer[low:high] & (tid[low:high] == main) & (ts[low:high] >= back_end))
        if len(after):  # what follows the backward pass, when it launches the optimizer's kernels
            rows.append(("optimizer", back_end, finish, 2, parent))
    if not rows:
        return empty_ranges()
    names, starts, ends, depth, parents = zip(*rows)
    return pd.DataFrame({"pid": np.full(len(rows), pid, "int32"), "tid": np.full(len(rows), pid, "int32"),
                         "start_ns": np.array(starts, "int64"), "end_ns": np.maximum(np.array(ends, "int64"), starts),
                         "name": np.array(names, dtype=object), "depth": np.array(depth, "int16"),
                         "parent": np.array(parents, "int64")})


def with_iteration_phases(ranges: pd.DataFrame, phases: list[pd.DataFrame]) -> pd.DataFrame:
    """The NVTX ranges and the kernel steps' phase ranges together, for the phase costs: each
    part's parents renumbered as rows of the whole."""
    parts = [ranges] + [p for p in phases if not p.empty]
    if len(parts) == 1:
        return ranges
    shifted, offset = [], 0
    for part in parts:  # a few processes
        parent = part["parent"].to_numpy()
        shifted.append(part.assign(parent=np.where(parent >= 0, parent + offset, -1)))
        offset += len(part)
    return pd.concat(shifted, ignore_index=True)
