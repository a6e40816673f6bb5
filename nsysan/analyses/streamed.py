"""The `--quick` analyses over a flow of time-ordered event batches, in bounded memory.

What `run_analyses` finds over the whole events frame, found from running sums instead: the flow
of events (events/stream.py) is read twice. The first look sums per (process, device, kind)
group and per process (this module, with the running sums and keyed columns both looks use);
the second (streamed_second.py), knowing every group's span, fills in what lies after a moment
(the engine's reducers: the timeline, the peaks with what was live there, ...). Only the live
allocations, the aggregates and the kept points stay in memory.
analyses.md says what is exact (all of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pandas as pd

from ..events.stream import EventBatch, no_rows
from ..model import GPU_RESIDENT_KINDS, KINDS
from .capture import Span

RESIDENT = [KINDS.index(k) for k in GPU_RESIDENT_KINDS]
STATIC = KINDS.index("static")


@dataclass
class Keyed:
    """Integer keys numbered in order of first appearance, with per-key int64 columns that grow."""

    columns: tuple[str, ...]
    fill: dict = field(default_factory=dict)
    index: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.data = {c: np.zeros(0, "int64") for c in self.columns}

    def codes(self, keys: np.ndarray) -> np.ndarray:
        slot, distinct = pd.factorize(keys)  # a hash pass, not a sort of the batch
        for k in distinct.tolist():
            if k not in self.index:
                self.index[k] = len(self.index)
        if len(self.index) > len(self.data[self.columns[0]]):
            grow = len(self.index) - len(self.data[self.columns[0]])
            for c in self.columns:
                self.data[c] = np.concatenate([self.data[c], np.full(grow, self.fill.get(c, 0), "int64")])
        return np.array([self.index[k] for k in distinct.tolist()], "int64")[slot]

    def __getitem__(self, column: str) -> np.ndarray:
        return self.data[column]

    def keys(self) -> list[int]:
        return list(self.index)


@dataclass
class FirstLook:
    """What one pass over the events sums up (see the module's docstring)."""

    span: Optional[Span] = None  # capture.EventSpan's answer
    # the largest allocations and how many there were (explore.LargestAllocations' answer), set
    # once this look is done, for the second look and the consumers after it
    allocations: int = 0
    largest: pd.DataFrame = field(default_factory=lambda: no_rows())
    big_blocks: pd.DataFrame = field(default_factory=lambda: no_rows())  # preallocations.BigBlocks' answer

    def add(self, b: EventBatch) -> None:
        pass

