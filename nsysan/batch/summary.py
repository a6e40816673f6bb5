"""The batch's summary: one row per report x process/GPU (a failed report is one row with its
error), and the fleet view of multi-rank jobs.

Fleet view. A fleet is the ranks of one job: the processes with ranks inside one report, or the
reports of one folder named like `rank3.nsys-rep` / `rank_3.sqlite`. For each fleet: which rank
peaks highest, the spread of peaks (lowest, median, highest), and the ranks whose growth per step
or never-freed bytes stand out. "Stand out" is the modified z-score of Iglewicz and Hoaglin,
0.6745 x (value - median) / MAD above 3.5, MAD being the median absolute deviation: one rank
that leaks among eight that don't shifts neither the median nor the MAD, where it would drag a
mean and a standard deviation with it. With a MAD of 0 (most ranks equal) any rank above the
median by more than 1 MiB and 5% stands out. Fewer than 3 ranks: no outliers are named (two
ranks can't say which one is odd), the highest peak and the spread still are.
"""

from __future__ import annotations

import collections
import re
import statistics
from pathlib import Path
from typing import Any, Callable, Optional

from ..runs.compare_runs import process_rows
from .departure import find_departure
from ..model import Analysis
from ..model.batch import Departure, Fleet, Outlier, SummaryRow
from ..base.units import fmt_bytes

MAD_SCORE = 3.5
MAD_FLOOR_BYTES = 1 << 20
MAD_FLOOR_SHARE = 0.05
_RANK_IN_NAME = re.compile(r"rank[_\-.]?(\d+)", re.IGNORECASE)


def summary_rows(result: dict[str, Any], analysis: Optional[Analysis]) -> list[SummaryRow]:
    """The rows of one worker result (its analysis already read back from the document)."""
    base = dict(report=result["path"], report_hash=result.get("hash"))
    if analysis is None:
        return [SummaryRow(status="failed", error=result.get("error") or "", **base)]
    of_process = process_warnings(analysis)
    ranks = {p.pid: p.rank for p in analysis.capture.processes}
    failed = collections.Counter(call.pid for call in analysis.failed_calls)
    rows = [SummaryRow(status="ok", process=analysis.process_label(row.pid), pid=row.pid, rank=ranks.get(row.pid),
                       gpu=row.gpu, device=row.device, peak_bytes=row.peak_bytes, end_bytes=row.end_bytes,
                       never_freed_bytes=row.never_freed_bytes, growth_per_step_bytes=row.growth_per_step,
                       failed_allocations=failed[row.pid], warnings=of_process(row.pid), **base)
            for row in process_rows(analysis)]
    if not rows:  # no GPU memory seen (sizes not collected, nothing allocated): the report still gets its row
        warnings = ",".join(sorted({d.code for d in analysis.diagnostics if d.severity in ("warning", "error")}))
        rows.append(SummaryRow(status="ok", warnings=warnings, failed_allocations=len(analysis.failed_calls), **base))
    return rows


def process_warnings(analysis: Analysis) -> Callable[[Optional[int]], str]:
    """pid -> the codes (comma-separated) of the warnings that concern that process: those whose
    message names it ("rank 1: ...", "rank 1 (process 2147) on GPU 1 grows ..."), and those that
    name none of the report's processes (the capture's own). A leak of rank 1 is then on rank 1's
    row, not on every rank's."""
    warnings = [d for d in analysis.diagnostics if d.severity in ("warning", "error")]
    names = {p.pid: [analysis.process_label(p.pid), f"process {p.pid}"] for p in analysis.capture.processes}

    def names_in(message: str) -> set[int]:
        return {pid for pid, labels in names.items()
                if any(re.search(rf"(?<![\w-]){re.escape(label)}(?![\w-])", message) for label in labels if label)}

    named = [(d.code, names_in(d.message)) for d in warnings]

    def of(pid: Optional[int]) -> str:
        return ",".join(sorted({code for code, pids in named if not pids or pid in pids}))
    return of


def fleet_view(rows: list[SummaryRow], steps: Optional[dict[str, list[dict[str, Any]]]] = None) -> list[Fleet]:
    """The fleets found in the rows, each with its highest rank, spread, outliers and, given each
    report's `steps` (departure.rank_steps, by report), the rank that departed first.

    A report holding two ranks or more is a fleet of its own. Reports of one rank each are the
    ranks of one job when they lie in one folder and either are named like rank3.nsys-rep (the rank
    in the name, or from RANK in the capture's environment when the name has another number) or
    name no rank but recorded RANK in their environment (`nsys profile -o prof_%q{RANK}`)."""
    steps = steps or {}
    fleets: dict[str, list[tuple[str, int, SummaryRow]]] = {}
    by_report: dict[str, list[SummaryRow]] = {}
    for row in rows:
        if row.status == "ok" and row.peak_bytes is not None:
            by_report.setdefault(row.report, []).append(row)
    for report, members in by_report.items():
        ranked = [r for r in members if r.rank is not None]
        if len({r.rank for r in ranked}) >= 2:
            fleets[report] = [(f"rank {r.rank}", r.rank, r) for r in _one_per_rank(ranked)]  # type: ignore[misc]
            continue
        path = Path(report)
        match = _RANK_IN_NAME.search(path.name)
        top = max(members, key=lambda r: r.peak_bytes or 0)
        if ranked:  # the one rank the capture's environment names
            rank = ranked[0].rank
        elif match:
            rank = int(match.group(1))
        else:
            continue
        job = str(path.parent / (_RANK_IN_NAME.sub("rank*", path.name) if match else "*"))
        fleets.setdefault(job, []).append((f"rank {rank} ({path.name})", rank, top))  # type: ignore[arg-type]
    found = []
    for name, members in fleets.items():
        if len({m[1] for m in members}) < 2:
            continue
        members = sorted(members, key=lambda m: m[1])
        inside = name in by_report  # the ranks of one report
        # A rank twice (two runs of one job in one folder) can't say which report is which run's
        departure = find_departure([(where, rank, row.report, _of_rank(steps.get(row.report, []), rank, inside))
                                    for where, rank, row in members], one_report=inside) \
            if len({m[1] for m in members}) == len(members) else None
        found.append(_fleet(name, members, departure))
    return found


def _of_rank(series: list[dict[str, Any]], rank: int, inside: bool) -> list[dict[str, Any]]:
    """The steps of `rank` among a report's: by the rank of the process inside a multi-rank
    report; in a report of one rank, its processes with steps (the rank may come from the name)."""
    if inside:
        return [s for s in series if s["rank"] == rank]
    return [s for s in series if s["rank"] in (rank, None)] or series


def _one_per_rank(rows: list[SummaryRow]) -> list[SummaryRow]:
    """A rank's row on the GPU of its highest peak (the first of equal ones)."""
    best: dict[Optional[int], SummaryRow] = {}
    for row in sorted(rows, key=lambda r: r.peak_bytes or 0, reverse=True):
        best.setdefault(row.rank, row)
    return list(best.values())


def _fleet(name: str, members: list[tuple[str, int, SummaryRow]], departure: Optional[Departure] = None) -> Fleet:
    peaks = [m[2].peak_bytes or 0 for m in members]
    top = max(members, key=lambda m: m[2].peak_bytes or 0)
    outliers = []
    for metric, what in (("growth_per_step_bytes", "growth per step"), ("never_freed_bytes", "never freed")):
        values = [(where, getattr(row, metric)) for where, _, row in members if getattr(row, metric) is not None]
        outliers.extend(_outliers(name, values, metric, what))
    return Fleet(name=name, ranks=len(members), highest=f"{top[0]}: {fmt_bytes(top[2].peak_bytes)}",
                 lowest_peak_bytes=min(peaks), median_peak_bytes=statistics.median(peaks),
                 highest_peak_bytes=max(peaks), outliers=outliers, departure=departure)


def _outliers(fleet: str, values: list[tuple[str, int]], metric: str, what: str) -> list[Outlier]:
    if len(values) < 3:
        return []
    numbers = [v for _, v in values]
    median = statistics.median(numbers)
    mad = statistics.median(abs(v - median) for v in numbers)
    found = []
    for where, value in values:
        score = 0.6745 * (value - median) / mad if mad > 0 else None
        stands_out = (score > MAD_SCORE if score is not None
                      else value - median > max(MAD_FLOOR_BYTES, MAD_FLOOR_SHARE * abs(median)))
        if stands_out:
            how = f"modified z-score {score:.1f}" if score is not None else "the other ranks are equal"
            found.append(Outlier(where=where, metric=metric, value=value, median=median, score=score,
                                 line=f"{where} of {fleet}: {what} {fmt_bytes(value)} against a median of "
                                      f"{fmt_bytes(int(median))} across {len(values)} ranks ({how})"))
    return found
