"""A batch's results: one `SummaryRow` per report x process/GPU, the fleet view of multi-rank jobs
(`Fleet`, its `Outlier`s and the `Departure` of the rank that started a growth), and the
`BatchResult` the summary files are written from. batch/ makes them (summary.py: the rows and
the outliers, departure.py: the departure); render/batch_summary.py writes them as summary.csv,
summary.html and fleets.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..base.units import fmt_bytes

FLEETS_SCHEMA = "nsysan/fleets@1"  # fleets.json (docs/json.md)


@dataclass(frozen=True)
class SummaryRow:
    """One report x process/GPU of the batch (or one failed report)."""

    report: str  # the path as given
    report_hash: Optional[str]  # SHA-256 of the file; None when it could not be read
    status: str  # ok | failed
    error: str = ""
    process: str = ""  # "rank 1", "process 2147"
    pid: Optional[int] = None
    rank: Optional[int] = None
    gpu: Optional[int] = None
    device: Optional[int] = None
    peak_bytes: Optional[int] = None
    end_bytes: Optional[int] = None
    never_freed_bytes: Optional[int] = None
    growth_per_step_bytes: Optional[int] = None
    failed_allocations: Optional[int] = None
    warnings: str = ""  # codes of the report's warning and error diagnostics, comma-separated


COLUMNS = [f for f in SummaryRow.__dataclass_fields__]


@dataclass(frozen=True)
class Outlier:
    where: str  # "rank 3 (job/rank3.sqlite)"
    metric: str  # growth_per_step_bytes | never_freed_bytes
    value: int
    median: float
    score: Optional[float]  # the modified z-score; None when the MAD was 0
    line: str


@dataclass(frozen=True)
class Departure:
    """The first rank whose growth per step departed from the other ranks', across reports."""

    rank: int
    report: str  # the report of that rank, as given
    where: str  # "rank 1 (torch_rank1_v25.sqlite)"
    step: int  # the number of the first step at which it departed
    step_bytes: int  # what it added in that step
    others_bytes: int  # the most any other rank added in that step
    bytes_per_step: int  # its growth verdict's median per step
    verdict: str  # its growth verdict (growing | uneven)
    sites: list[str] = field(default_factory=list)  # where its growth stays: "site in 'range'", largest first
    step_start_utc_ns: Optional[int] = None  # when that step began on that rank, UTC epoch ns
    step_spread_ns: Optional[int] = None  # how far apart that step began on the ranks (session starts + step starts)
    ranks_compared: int = 0
    line: str = ""


@dataclass(frozen=True)
class Fleet:
    name: str  # the report (ranks inside it) or the folder of rank-named reports
    ranks: int
    highest: str  # "rank 1: 1.6 GiB"
    lowest_peak_bytes: int
    median_peak_bytes: float
    highest_peak_bytes: int
    outliers: list[Outlier] = field(default_factory=list)
    # the first rank whose growth per step departed from the others' (batch/departure.py finds it); None:
    # none did, or the reports' steps were not sent (summary rows read back without them)
    departure: Optional[Departure] = None

    @property
    def line(self) -> str:
        return (f"{self.name}: {self.ranks} ranks, highest peak {self.highest}; peaks "
                f"{fmt_bytes(self.lowest_peak_bytes)} / {fmt_bytes(int(self.median_peak_bytes))} / "
                f"{fmt_bytes(self.highest_peak_bytes)} (lowest / median / highest)")


@dataclass
class BatchResult:
    reports: int  # how many were to be analyzed
    analyzed: int = 0
    failed: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    engine: str = ""
    rows: list[SummaryRow] = field(default_factory=list)
    fleets: list[Fleet] = field(default_factory=list)
    out_dir: Optional[Path] = None
    db_path: Optional[Path] = None
