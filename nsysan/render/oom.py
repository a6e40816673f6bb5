"""Terminal verdicts on out of memory, reserved memory and pools: short lines, then what was live.

Drawn from `analysis.oom`, `analysis.reserved` and the peaks' notes alone; `render_terminal`
places them (first screen).
"""

from __future__ import annotations

from typing import Union

from ..errors import printable
from ..model import Allocation, Analysis
from ..base.units import fmt_bytes, fmt_duration, fmt_time
from .layout import NAME, WORD, Column, Sheet

# One answer line: (label, severity, text); the terminal lines them up with the other answers.
Answer = tuple[str, str, str]


def oom_and_reserved(analysis: Analysis, top: int = 5) -> list[Union[Answer, Sheet]]:
    """The verdict lines (out of memory, probes, runs cut short, reserved vs used, preallocation,
    pools, what made the peak), each followed by its live set where it has one."""
    label, parts = analysis.process_label, []  # type: ignore[var-annotated]
    oom = analysis.oom
    for logged in oom.logged[:3]:
        parts.append(_line("error", "out of memory", logged.message))
    if len(oom.logged) > 3:
        parts.append(_line("info", "more", f"… and {len(oom.logged) - 3} more logged errors (see --format json)"))
    for failure in oom.failures[:3]:
        where = f" in {failure.nvtx_path}" if failure.nvtx_path else ""
        text = (f"{label(failure.pid)}: call #{failure.call_number} of {failure.api} failed "
                f"({failure.error}) at {fmt_time(failure.time_ns)}{where}")
        if failure.gpu_live_bytes is not None:
            text += f"; {fmt_bytes(failure.gpu_live_bytes)} live on GPU {failure.gpu}"
            if failure.headroom_bytes is not None:
                text += (f" of {fmt_bytes(failure.total_memory_bytes)}, at most {fmt_bytes(failure.headroom_bytes)} "
                         "left (context and kernel images not in the trace)")
        parts.append(_line("warning", "out of memory", text + "; the size it asked for is not recorded"))
        parts.extend(_live_table(f"Live on GPU {failure.gpu} at the failure", failure.live_at_failure,
                                 failure.live_count, failure.time_ns, top))
    for allocator_oom in oom.allocator_ooms:
        release = allocator_oom.release
        text = (f"{label(release.pid)}: the caching allocator gave up at {fmt_time(release.start_ns)}"
                f"{' in ' + release.nvtx_path if release.nvtx_path else ''}: it freed {release.blocks} cached blocks "
                f"({fmt_bytes(release.released_bytes)}) in {fmt_duration(release.end_ns - release.start_ns)}, "
                f"{fmt_bytes(release.live_before_bytes)} -> {fmt_bytes(release.live_after_bytes)} live, and "
                "allocated nothing after"
                + (f"; {' > '.join(allocator_oom.open_ranges)} never closed" if allocator_oom.open_ranges else "")
                + ". A set_per_process_memory_fraction cap is invisible to nsys")
        parts.append(_line("warning", "allocator OOM?", text))
        parts.extend(_live_table("Live when the allocator gave up", allocator_oom.live_at_release,
                                 allocator_oom.live_count, release.start_ns, top))
    for ended in oom.ended_inside:
        parts.append(_line("warning", "ended inside", ended.message))
    said = {o.release.pid for o in oom.allocator_ooms} | {e.pid for e in oom.ended_inside}
    for cut in oom.cut_short:
        if cut.pid not in said:
            why = " > ".join(cut.open_ranges) + " never closed" if cut.open_ranges else "memory still climbing"
            parts.append(_line("warning", "cut short", f"{label(cut.pid)}: the capture ends while it works ({why})"))
    if oom.cache_flushes:
        parts.append(_line("info", "cache flushes",
                           f"{len(oom.cache_flushes)} (empty_cache() or allocator retries, PyTorch's num_alloc_retries)"))
    for probe in oom.probes[:3]:
        parts.append(_line("info", "probe", f"{label(probe.pid)}: {probe.api} returned {probe.error} and succeeded "
                                            f"{fmt_duration(probe.retried_after_ns)} later: not a failure"))
    for use in analysis.reserved.allocators[:LINES_PER_KIND]:
        if use.allocator.endswith("preallocation"):
            continue  # the preallocation line says it
        outside = f"; {fmt_bytes(use.outside_at_peak_bytes)} outside it (library workspaces)" \
            if use.outside_at_peak_bytes else ""
        parts.append(_line("info", "reserved", f"{label(use.pid)} on GPU {use.gpu}: {use.name} "
                                               f"reserved {fmt_bytes(use.inside_at_peak_bytes)} at the peak; tensors "
                                               f"use less, and nsys cannot see how much{outside}. Never-freed blocks "
                                               "at exit are its cache: watch growth per step"))
    for block in analysis.reserved.preallocations[:LINES_PER_KIND]:
        parts.append(_line("warning" if block.framework else "info", "preallocated", block.message))
    used_pools = [pool for pool in analysis.reserved.pools if pool.peak_used_bytes]
    for pool in used_pools[:LINES_PER_KIND]:
        counted = "its reserve counts in the peak"
        trims = f", trimmed {pool.trims} time{'s' if pool.trims != 1 else ''}" if pool.trims else ""
        end = ("destroyed before the end" if pool.destroyed_ns is not None
               else f"{fmt_bytes(pool.end_reserved_bytes)} still reserved at the end of the run"
               if pool.end_reserved_bytes else "nothing left reserved at the end")
        parts.append(_line("info", "pool", f"{label(pool.pid)}: a memory pool on GPU {pool.gpu} reserved up to "
                                           f"{fmt_bytes(pool.peak_reserved_bytes)} while handing out at most "
                                           f"{fmt_bytes(pool.peak_used_bytes)}{trims}; {end}; {counted}"))
    hidden = sum(max(0, len(items) - LINES_PER_KIND) for items in
                 (analysis.reserved.allocators, analysis.reserved.preallocations, used_pools))
    if hidden:  # one per process and GPU: thousands in a large capture
        parts.append(_line("info", "more", f"… and {hidden} more lines like these (see --format json)"))
    if analysis.peak is not None and analysis.peak.note:
        parts.append(_line("info", "peak", f"{fmt_bytes(analysis.peak.peak_bytes)} at "
                                           f"{fmt_time(analysis.peak.peak_time_ns)}: {analysis.peak.note}"))
    return parts


LINES_PER_KIND = 20  # allocator, preallocation and pool lines shown, each
# The answers (analyses/answers.py) these lines say in full; the terminal prints the others itself.
DRAWN_CODES = frozenset({"oom_logged", "allocation_failed", "allocator_oom_suspected", "ended_inside",
                         "run_cut_short", "preallocation", "caching_allocator"})


def _line(severity: str, what: str, text: str) -> Answer:
    return (what, severity, printable(text))


def _live_table(title: str, live: list[Allocation], count: int, at_ns: int, top: int) -> list[Sheet]:
    if not live:
        return []
    table = Sheet(title, Column("size"), Column("kind", WORD, 2), Column("API", WORD, 1),
                  Column("NVTX range", NAME), Column("age"))
    for a in live[:top]:
        table.add_row(fmt_bytes(a.bytes), a.kind, printable(a.api), printable(a.nvtx_range or "-"),
                      fmt_duration(max(at_ns - a.alloc_time_ns, 0)))
    if count > min(top, len(live)):
        table.caption = f"… and {count - min(top, len(live))} more"
    return [table]
