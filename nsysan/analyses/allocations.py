"""Turn alloc rows of the events frame into `Allocation` records (only for short, capped lists)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..model import Allocation
from .sites import call_site


def to_allocations(rows: pd.DataFrame, events: pd.DataFrame, site_table: dict[str, dict]) -> list[Allocation]:
    """Allocation records for `rows` (alloc events); the free time comes from the partner row."""
    if rows.empty:
        return []
    partner = rows["partner"].to_numpy()
    all_ts = events["ts_ns"].to_numpy()
    free_ts = np.where(partner >= 0, all_ts[np.maximum(partner, 0)], -1)
    columns = ["pid", "tid", "device", "kind", "api", "address", "bytes", "ts_ns", "nvtx_range", "site", "stack",
               "operator"]
    return [
        Allocation(pid=int(pid), tid=int(tid), device=int(device), kind=str(kind), api=str(api),
                   address=int(address), bytes=int(size), alloc_time_ns=int(ts),
                   free_time_ns=int(freed) if freed >= 0 else None, nvtx_range=str(nvtx),
                   site=call_site(str(site), site_table), stack_id=int(stack) if stack >= 0 else None,
                   operator=str(operator))
        for pid, tid, device, kind, api, address, size, ts, nvtx, site, stack, operator, freed
        # columns as lists, not itertuples: this runs for each of thousands of processes' peaks
        in zip(*(rows[c].tolist() for c in columns), free_ts.tolist())  # capped lists only
    ]
