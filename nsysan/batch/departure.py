"""Which rank started it, across the reports of one job (issue 30, section 5).

A job profiled with one report per rank (`nsys profile -o rank%q{RANK}` under torchrun) has its
steps in several reports. Each worker sends, with its report's rows, the steps of each process
(`rank_steps`): the delta and growth threshold of every judged step, and where each step began
on the UTC clock (the report's session start, TARGET_INFO_SESSION_START_TIME, plus the step's
start). The fleet view then aligns the reports' steps by number, finds the first step at which
one rank added more than its threshold above the most any other rank added then
(growth.first_departure, the rule `analyze` applies to the ranks inside one report), and names
that rank, its report, its growth and where its memory stays (site and NVTX range). The session
starts say whether the aligned steps ran together: the step's start on each rank's clock, the
spread between them.
"""

from __future__ import annotations

from typing import Any, Optional

from ..analyses.growth import GROWTH_CODES, first_departure, step_deltas
from ..model import Analysis
from ..model.batch import Departure
from ..base.units import fmt_bytes, fmt_duration, fmt_utc

MAX_SITES = 3


def rank_steps(analysis: Analysis) -> list[dict[str, Any]]:
    """What the fleet view needs of one report's steps, plain data that pickles small: one dict
    per (process, device) with steps."""
    ranks = {p.pid: p.rank for p in analysis.capture.processes}
    verdicts = {(g.pid, g.device): g for g in analysis.growth}
    start = analysis.capture.session_start_utc_ns
    out = []
    for series in analysis.steps:
        growth = verdicts.get((series.pid, series.device))
        out.append({
            "pid": series.pid, "device": series.device, "gpu": series.gpu, "rank": ranks.get(series.pid),
            "verdict": growth.verdict if growth else "", "bytes_per_step": growth.bytes_per_step if growth else 0,
            "sites": [f"{h.site} in '{h.nvtx_range}'" if h.nvtx_range else h.site
                      for h in (growth.holders if growth else [])[:MAX_SITES]],
            "deltas": {n: list(d) for n, d in step_deltas(series.steps).items()},
            "starts_utc_ns": ({s.number: start + s.start_ns for s in series.steps} if start is not None else {}),
        })
    return out


def find_departure(members: list[tuple[str, int, str, list[dict[str, Any]]]],
                   one_report: bool = False) -> Optional[Departure]:
    """`members`: (where, rank, report, rank_steps of that rank's process(es)), one per rank of
    the fleet (`one_report`: the ranks of one report, on its one clock). The first departure, or
    None when no rank departs (or fewer than two have steps)."""
    deltas: dict[tuple[int, int], dict[int, tuple[int, int]]] = {}
    info: dict[tuple[int, int], tuple[str, str, dict[str, Any]]] = {}
    for where, rank, report, series in members:
        for one in series:
            key = (rank, one["device"])
            deltas[key] = {int(n): (d[0], d[1]) for n, d in one["deltas"].items()}
            info[key] = (where, report, one)
    candidates = {key for key, (_, _, one) in info.items() if one["verdict"] in GROWTH_CODES}
    found = first_departure(deltas, candidates)
    if found is None:
        return None
    number, key, mine, others = found
    where, report, one = info[key]
    starts = [s for s in (_start(o, number) for _, _, o in info.values()) if s is not None]
    own_start = _start(one, number)
    spread = max(starts) - min(starts) if len(starts) == len(info) and len(starts) >= 2 else None
    ranks_compared = len({rank for rank, _ in deltas})
    line = (f"{where} departs first, at step {number}: +{fmt_bytes(mine)} where the other ranks added at most "
            f"{fmt_bytes(others)}; it then {'grows' if one['verdict'] == 'growing' else 'keeps'} "
            f"{fmt_bytes(one['bytes_per_step'])} per step")
    if one["sites"]:
        line += ", from " + ", ".join(one["sites"])
    if own_start is not None and spread is not None:
        line += (f"; step {number} began at {fmt_utc(own_start)}, within {fmt_duration(spread)} on "
                 f"{ranks_compared} ranks ({'on the report' + chr(39) + 's clock' if one_report else 'the reports aligned on their session starts'})")
    else:
        line += "; steps aligned by number only (a report did not record its session start)"
    return Departure(rank=key[0], report=report, where=where, step=number, step_bytes=mine, others_bytes=others,
                     bytes_per_step=one["bytes_per_step"], verdict=one["verdict"], sites=list(one["sites"]),
                     step_start_utc_ns=own_start, step_spread_ns=spread, ranks_compared=ranks_compared, line=line)


def _start(one: dict[str, Any], number: int) -> Optional[int]:
    starts = one["starts_utc_ns"]
    value = starts.get(number, starts.get(str(number)))
    return int(value) if value is not None else None

