"""Allocations not freed by the end of the capture (the per-group totals: groups.py)."""

from __future__ import annotations

from typing import Callable

import pandas as pd

from ..model import Allocation

# Module globals (`__device__` variables) are loaded once and never freed: static memory, not
# leaks. They are counted in their own group instead.
NOT_LEAKS = ("static", "managed_static")
MAX_LISTED = 500


def never_freed_rows(events: pd.DataFrame) -> pd.DataFrame:
    """Alloc events with no free in the capture (static memory excluded), largest first."""
    rows = events[((events["op"] == "alloc") & (events["partner"] < 0) & ~events["kind"].isin(NOT_LEAKS)).to_numpy()]
    return rows.sort_values(["bytes", "ts_ns"], ascending=[False, True], kind="stable")


def find_never_freed(events: pd.DataFrame,
                     to_allocations: Callable[[pd.DataFrame], list[Allocation]]) -> tuple[list[Allocation], int]:
    """The never-freed allocations (at most MAX_LISTED, largest first) and how many there are."""
    rows = never_freed_rows(events)
    return to_allocations(rows.head(MAX_LISTED)), int(len(rows))
