"""What the streamed analyses share: the flow's codes of the GPU-resident and static kinds, and
keyed columns that grow as keys come."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..model import GPU_RESIDENT_KINDS, KINDS

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
