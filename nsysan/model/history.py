"""The result of `nsysan history`: the runs a batch database holds, in order, and where each
tracked number first moved beyond the noise of the runs before it (schema "nsysan/history@1")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

HISTORY_SCHEMA = "nsysan/history@1"
# The numbers a history tracks, as (field of HistoryRun, how outputs name it).
METRICS = (("peak_bytes", "peak"), ("growth_bytes_per_step", "growth per step"),
           ("never_freed_bytes", "never freed"))


@dataclass(frozen=True)
class HistoryRun:
    """One analyzed report of the database, in history order."""

    index: int  # 1, 2, ... in history order
    report_hash: str
    name: str  # the report's file name
    tags: dict[str, str]  # `batch --tag KEY=VALUE` (a bare --tag VALUE is {"tag": VALUE})
    analyzed_at: str  # ISO 8601, UTC
    peak_bytes: Optional[int]  # the highest per-process peak; None without sizes
    growth_bytes_per_step: Optional[int]  # the largest growth per step of any process; None without steps
    growth_verdict: Optional[str]  # that process's verdict (growing, stable, ...); None without steps
    never_freed_bytes: Optional[int]  # device + array bytes never freed; None without sizes

    @property
    def label(self) -> str:
        """How outputs name the run: its tags, else its file name."""
        return " ".join(f"{k}={v}" if k != "tag" else v for k, v in self.tags.items()) or self.name


@dataclass(frozen=True)
class Mover:
    """A call site or NVTX range whose bytes moved most between the run before a change and the change."""

    what: str  # "site" | "range"
    label: str
    before_bytes: int
    after_bytes: int
    measure: str  # "max_live_bytes" (for a peak) | "never_freed_bytes" (for growth and never freed)


@dataclass(frozen=True)
class ChangePoint:
    """The first run at which one metric moved beyond the noise of the runs before it."""

    metric: str  # a field of HistoryRun: peak_bytes | growth_bytes_per_step | never_freed_bytes
    run: int  # HistoryRun.index of the change
    before_bytes: int  # the median of the runs before it (since the previous change of this metric)
    after_bytes: int  # the run's own value
    noise_bytes: int  # how far a run may move and still be noise (the rule in docs/history.md)
    runs_before: int  # how many runs the median and the noise come from
    movers: list[Mover] = field(default_factory=list)  # largest move first
    message: str = ""  # the change in one sentence, as shown


@dataclass(frozen=True)
class History:
    schema: str  # "nsysan/history@1"
    database: str  # the database's file name
    ordered_by: str  # "tag:KEY" | "analyzed_at"
    series: Optional[str]  # "KEY=VALUE" when --where chose one series, else None
    runs: list[HistoryRun]
    changes: list[ChangePoint]  # in run order; a metric may change more than once
    skipped: int = 0  # reports in the database that failed or matched no --where

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
