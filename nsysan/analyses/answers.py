"""The answers shown first: the peak and what made it, growth, out-of-memory, and the warnings that
say the numbers cannot be fully trusted. Built from the other analyses' results; nothing new is
measured here, so the terminal and the HTML page print the same sentences."""

from __future__ import annotations

from typing import Optional

from ..model import Answer, Diagnostic, Growth, Peak
from .growth import GROWTH_CODES
from ..base.units import fmt_bytes, fmt_share, fmt_time

MAX_PEAKS = 4
MAX_PARTS = 3  # what made a peak: the largest (site, range) pairs named

# Diagnostics that answer "why did it run out of memory" (this module's and the OOM analyses').
OOM_CODES = ("oom_logged", "near_capacity", "allocation_failed", "allocator_oom_suspected", "ended_inside",
             "run_cut_short")
# ... and reserved memory: the terminal draws both in detail (render/oom.py).
RESERVED_CODES = ("preallocation", "caching_allocator", "vmm_without_access")
# (the growth warnings' codes are growth.GROWTH_CODES)


def gather_answers(headline: Optional[Peak], process_peaks: list[Peak], growth: list[Growth],
                    diagnostics: list[Diagnostic], quick: bool = False,
                    labels: Optional[dict[int, str]] = None, byte_classes: Optional[list] = None) -> list[Answer]:
    """Peaks (the headline first), growth verdicts, what the bytes are, OOM findings, then every
    other warning or error. `labels`: pid -> how outputs name the process ("rank 1")."""
    labels = labels or {}
    answers = [Answer("peak", "info", "peak", peak_sentence(p, quick, labels.get(p.pid, "")))
                for p in process_peaks[:MAX_PEAKS]]
    if headline is not None and not answers:
        answers.append(Answer("peak", "info", "peak", peak_sentence(headline, quick, labels.get(headline.pid, ""))))
    if len({g.pid for g in growth}) > 1:
        answers.append(Answer("growth", "warning" if any(g.verdict in GROWTH_CODES for g in growth) else "info",
                                "growth_by_process", fleet_sentence(growth)))
    for g in growth:
        code = GROWTH_CODES.get(g.verdict, f"growth_{g.verdict}")  # a warning's code is its diagnostic's
        answers.append(Answer("growth", "warning" if g.verdict in GROWTH_CODES else "info", code, g.message))
    # what the bytes are (analyses/byte_classes.py), where a rule names some of them (not a late
    # capture whose every block was live when it began)
    named = [b for b in byte_classes or [] if b.peak.live_bytes > b.peak.other_bytes + b.peak.cache_bytes]
    several = len(named) > 1
    for b in named[:MAX_PEAKS]:
        who = f"{labels.get(b.pid) or f'process {b.pid}'} on device {b.device}: " if several else ""
        answers.append(Answer("bytes", "info", "byte_classes", who + b.message))
    # the program's own error message first: it says what the trace cannot (the request, the cap)
    answers += [Answer("oom", d.severity, d.code, d.message)
                for d in sorted((d for d in diagnostics if d.code in OOM_CODES), key=lambda d: d.code != "oom_logged")]
    serious = [d for d in diagnostics if d.severity in ("error", "warning")]
    answers += [Answer("reserved", d.severity, d.code, d.message) for d in serious if d.code in RESERVED_CODES]
    return answers + [Answer("trust", d.severity, d.code, d.message) for d in serious
                      if d.code not in OOM_CODES + RESERVED_CODES + tuple(GROWTH_CODES.values())]


def peak_sentence(peak: Peak, quick: bool = False, label: str = "") -> str:
    """"5.3 GiB on GPU 0 (3.8% of 139.8 GiB), process 1644 at 10.125 s in 'optimizer' (cudaMalloc);
    made of ..." """
    where = f"GPU {peak.gpu}" if peak.gpu is not None else f"CUDA device {peak.device}"
    share = fmt_share(peak.peak_bytes, peak.total_memory_bytes)
    of = f" ({share} of {fmt_bytes(peak.total_memory_bytes)})" if peak.total_memory_bytes else ""
    who = ", all processes" if peak.pid is None else (
        f", {label} (process {peak.pid})" if label and label != f"process {peak.pid}" else f", process {peak.pid}")
    inside = f" in '{peak.nvtx_range}'" if peak.nvtx_range else ""
    by = f" ({peak.api})" if peak.api and not quick else ""  # a quick analysis has no API names
    sentence = f"{fmt_bytes(peak.peak_bytes)} on {where}{of}{who} at {fmt_time(peak.peak_time_ns)}{inside}{by}"
    named = [h for h in peak.made_of if h.site][:MAX_PARTS]  # no sites in a quick analysis
    if named:
        parts = [f"{h.site} {fmt_bytes(h.bytes)} ({h.allocations})" for h in named]
        sentence += "; made of " + ", ".join(parts)
        rest = peak.live_count - sum(h.allocations for h in named)
        if rest > 0:
            sentence += f" and {rest} more allocations"
    return sentence


_SHORT = {"growing": "grows {rate}/step", "uneven": "keeps memory in some steps", "stable": "is stable",
          "too_few_steps": "is not judged", "preallocated": "allocates inside a preallocation"}


def fleet_sentence(growth: list[Growth]) -> str:
    """"rank 1 grows 64.0 MiB/step; rank 0 is stable": the odd one out first. Growth per step is
    compared, not totals: ranks may work on batches of different sizes."""
    order = {"growing": 0, "uneven": 1, "stable": 2, "too_few_steps": 3}
    ranked = sorted(growth, key=lambda g: (order.get(g.verdict, 4), -g.bytes_per_step, g.process))
    parts = [f"{g.process} " + _SHORT.get(g.verdict, g.verdict).format(rate=fmt_bytes(g.bytes_per_step))
             for g in ranked]
    first = next((g for g in growth if g.departure_step is not None), None)
    if first is None:
        return "; ".join(parts)
    where = f", kept by {first.holders[0].site}" if first.holders else ""
    return (f"{first.process} departs first, at step {first.departure_step}: +{fmt_bytes(first.departure_bytes)} "
            f"where the others added at most {fmt_bytes(first.others_bytes)}{where}; " + "; ".join(parts))
