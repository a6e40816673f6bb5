"""Allocations not freed by the end of the capture (the per-group totals: groups.py), one reducer
for the whole frame and the streamed flow."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from ..engine import Facts, Reducer

if TYPE_CHECKING:
    from ..events.batch import EventBatch

# Module globals (`__device__` variables) are loaded once and never freed: static memory, not
# leaks. They are counted in their own group instead.
NOT_LEAKS = ("static", "managed_static")
MAX_LISTED = 500


class NeverFreed(Reducer):
    """The allocations never freed by the end of the capture (static memory excluded), largest
    first, then earliest: those whose address another allocation took while they were live (a
    batch's `closed`) and those live after the last batch. Its answer: their rows (LIVE_COLUMNS;
    `seq` numbers the events as the whole frame does)."""

    field = "never_freed"

    def start(self, facts: Facts) -> None:
        super().start(facts)
        self.exempt = [code for code, kind in enumerate(facts.kinds) if kind in NOT_LEAKS]
        self.closed: list[pd.DataFrame] = []

    def add(self, b: "EventBatch") -> None:
        if len(b.closed.get("seq", ())):
            self.closed.append(self._leaks(b.closed))

    def _leaks(self, rows: dict) -> pd.DataFrame:
        frame = pd.DataFrame(rows)
        return frame[~frame["kind"].isin(self.exempt).to_numpy()]

    def finish(self, live: dict) -> pd.DataFrame:
        frame = pd.concat(self.closed + [self._leaks(live)], ignore_index=True)
        return frame.sort_values(["bytes", "ts", "seq"], ascending=[False, True, True], kind="stable",
                                 ignore_index=True)
