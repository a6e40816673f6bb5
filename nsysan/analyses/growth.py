"""The growth verdict: does a process's memory grow every step, by how much, and who keeps it.

The rule (docs/analyses.md, "Steps and the growth verdict"):
- A step's delta is its live bytes at the end minus the previous step's at the end.
- Warm-up is left out: the first step always, then the steps whose delta is still far from the
  steady state. The steady state is the median delta of the later half of the steps; a delta is
  far from it when it differs by more than max(1 MiB, 1% of live bytes, 10% of that median).
  At least MIN_JUDGED steps stay judged.
- Growing: at least MIN_GROWING consecutive judged steps each add more than max(1 MiB, 1% of the
  live bytes at their start); the rate is the median delta of the judged steps.
- Uneven: not growing, but the judged steps together kept more than that threshold (a leak that
  does not happen every step, e.g. a cache entry every third step).
- Refilled (stable): a judged step gave back more than that threshold (torch.cuda.empty_cache(),
  or the allocator releasing its cache) and the last FLAT_AFTER_FLUSH steps or more after it
  changed nothing: "gave 2.2 GiB back in step 3 ..., took 2.5 GiB again in steps 4-5 and is flat
  since step 5", however uneven the steps around it look.
- Stable: neither. When the steps left out as warm-up after the first one still added more than
  that threshold, it says so: "grew during steps 0-3 (+5.8 GiB), flat since step 3"; when the
  last MIN_JUDGED steps or more allocated and freed nothing at all: "is flat: nothing allocated
  or freed in steps 0-4".
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

import numpy as np

from ..model import Diagnostic, Growth, Holder, MemoryCap, Process, Step, StepSeries
from ..base.units import fmt_bytes, fmt_duration
from .iterations import longest_run

MIB = 1 << 20
MIN_GROWING = 3
MIN_JUDGED = 3  # steps judged at least, after the warm-up
FLAT_AFTER_FLUSH = 2  # flat steps after memory given back that make a refill, not a leak
MAX_HOLDERS = 3
LABEL_CHARS = 80  # a holder's label in the message; the JSON has it whole
_DIGITS = re.compile(r"\d+")

# The warning each verdict raises, if any.
GROWTH_CODES = {"growing": "memory_growth", "uneven": "memory_kept_unevenly"}
# How the projection names what it runs into, by MemoryCap.source.
_CAP_NAMES = {"gpu_total": "the GPU's {}", "xla_preallocation": "XLA's preallocated {}",
              "allocator_oom": "the {} at which the allocator gave up"}


def judge_all(steps: list[StepSeries], processes: list[Process], caps: list[MemoryCap]) -> list[Growth]:
    """A verdict per step series, naming processes by rank when known and projecting to the
    tightest known cap of each (process, device)."""
    labels = {p.pid: p.label for p in processes if p.label}
    verdicts = []
    for series in steps:  # one per (process, device)
        mine = [c for c in caps if c.pid == series.pid and c.device == series.device]
        cap = min(mine, key=lambda c: c.cap_bytes) if mine else None
        # Other processes with steps on the same GPU take their share of it (the trace sees them)
        shared = sum(other.steps[-1].end_live_bytes for other in steps if other.pid != series.pid
                     and other.gpu is not None and other.gpu == series.gpu and other.steps)
        growth = judge_growth(series, cap, labels.get(series.pid, ""), shared)
        if cap is not None and cap.source == "xla_preallocation":
            growth = _inside_preallocation(growth, cap)
        verdicts.append(growth)
    return mark_departures(steps, verdicts)


def mark_departures(steps: list[StepSeries], growth: list[Growth]) -> list[Growth]:
    """Which process started it, where several have steps (the ranks of one job): the first
    departure (first_departure) among the processes whose own verdict is growing or uneven (a
    one-off bump of a stable process is not a departure), marked on its verdict."""
    if len({s.pid for s in steps}) < 2:
        return growth
    deltas = {(series.pid, series.device): step_deltas(series.steps) for series in steps}
    candidates = {(g.pid, g.device) for g in growth if g.verdict in GROWTH_CODES}
    found = first_departure(deltas, candidates)
    if found is None:
        return growth
    number, key, mine, others = found
    return [dataclasses.replace(g, departure_step=number, departure_bytes=mine, others_bytes=others)
            if (g.pid, g.device) == key else g for g in growth]


def step_deltas(steps: list[Step]) -> dict[int, tuple[int, int]]:
    """step number -> (its delta, its growth threshold), of the judged steps: closed, traced, and
    not the first (warm-up)."""
    usable = [s for s in steps if s.closed and s.traced][1:]
    return {s.number: (s.delta_bytes, _threshold(s.start_live_bytes)) for s in usable}


def first_departure(deltas: dict[Any, dict[int, tuple[int, int]]],
                    candidates: set) -> Optional[tuple[int, Any, int, int]]:
    """(step, key, its delta, the most any other added then) of the first departure: the steps of
    every (who, device) key aligned by number, the first step at which a candidate added more than
    its growth threshold above the most that any other `who` added at that step. The earliest such
    step wins; at one step, the largest excess. Shared by one report's processes (mark_departures)
    and the reports of one job, one per rank (batch/departure.py)."""
    deltas = {key: d for key, d in deltas.items() if d}
    if len({who for who, _ in deltas}) < 2:
        return None
    common = sorted(set.intersection(*(set(d) for d in deltas.values())))
    for number in common:
        excess = []
        for key in candidates & set(deltas):
            mine, threshold = deltas[key][number]
            others = max(d[number][0] for k, d in deltas.items() if k[0] != key[0])
            if mine - others > threshold:
                excess.append((mine - others, key, mine, others))
        if excess:
            _, key, mine, others = max(excess)
            return number, key, mine, others
    return None


def _inside_preallocation(growth: Growth, cap: MemoryCap) -> Growth:
    """A framework that reserved its memory up front allocates inside that block, out of the
    trace's sight: flat steps would be a false all-clear."""
    who = process_name(growth.pid, growth.gpu, growth.device, growth.process)
    return dataclasses.replace(
        growth, verdict="preallocated", capacity_step=None,
        message=f"{who}: XLA preallocated {fmt_bytes(cap.cap_bytes)} and allocates inside it, out of the trace's "
                "sight, so growth per step cannot be seen; run with XLA_PYTHON_CLIENT_PREALLOCATE=false or "
                "XLA_PYTHON_CLIENT_ALLOCATOR=platform to see it")


def growth_diagnostics(growth: list[Growth]) -> list[Diagnostic]:
    return [Diagnostic("warning", GROWTH_CODES[g.verdict], g.message) for g in growth if g.verdict in GROWTH_CODES]


def process_name(pid: int, gpu: Optional[int], device: int, label: str = "") -> str:
    """"rank 1 (process 2147) on GPU 1", or "process 1644 on GPU 0" without a rank."""
    who = f"{label} (process {pid})" if label and label != f"process {pid}" else f"process {pid}"
    return f"{who} on GPU {gpu}" if gpu is not None else f"{who} on CUDA device {device}"


def judge_growth(series: StepSeries, cap: Optional[MemoryCap] = None, label: str = "", shared_bytes: int = 0) -> Growth:
    """The verdict for one process and device (see the module's docstring for the rule); `cap` is
    what the projection runs into, `label` the process's name ("rank 1"), `shared_bytes` what
    other processes on the same GPU hold at their last step (a GPU's total is theirs too). Steps
    that no NVTX range marked say how they were found: the verdict is only as sure as they are."""
    growth = _judged(series, cap, label, shared_bytes)
    if series.found_how:
        growth = dataclasses.replace(growth, message=f"{growth.message}; {series.found_how}")
    return growth


def _judged(series: StepSeries, cap: Optional[MemoryCap], label: str, shared_bytes: int) -> Growth:
    # A step cut short by the capture's end, or past the end of the CUDA trace, says nothing.
    steps = [s for s in series.steps if s.closed and s.traced]
    who = process_name(series.pid, series.gpu, series.device, label)
    base = dict(pid=series.pid, device=series.device, gpu=series.gpu, process=label or f"process {series.pid}",
                capacity_bytes=cap.cap_bytes if cap is not None else None,
                capacity_source=cap.source if cap is not None else "")
    if len(steps) < 1 + MIN_GROWING:
        why = (f"{len(steps)} complete steps, too few to judge growth (needs {1 + MIN_GROWING})"
               if all(s.traced for s in series.steps) else
               f"the CUDA trace stops before {sum(not s.traced for s in series.steps)} of its "
               f"{len(series.steps)} steps end, so growth is not judged")
        return Growth(**base, verdict="too_few_steps", first_step=None, last_step=None, bytes_per_step=0,
                      total_bytes=0, threshold_bytes=MIB, growing_steps=[],
                      end_live_bytes=steps[-1].end_live_bytes if steps else 0, capacity_step=None, holders=[],
                      message=f"{who}: {why}")
    deltas = np.array([s.delta_bytes for s in steps], "int64")
    first = _settled_from(deltas, steps[-1].end_live_bytes)
    judged = steps[first:]
    grows = deltas[first:] > np.array([_threshold(s.start_live_bytes) for s in judged], "int64")
    rate = int(np.median(deltas[first:]))
    holders = _holders(judged, series.range_name)
    judged_fields = dict(first_step=judged[0].number, last_step=judged[-1].number, bytes_per_step=rate,
                         total_bytes=judged[-1].end_live_bytes - steps[first - 1].end_live_bytes,
                         threshold_bytes=_threshold(judged[0].start_live_bytes),
                         end_live_bytes=judged[-1].end_live_bytes, holders=holders)
    span = _span(judged)
    step_time = int(np.median([s.end_ns - s.start_ns for s in judged]))
    refilled = _refilled(judged)
    if refilled:
        return Growth(**base, **judged_fields, verdict="stable", capacity_step=None,
                      growing_steps=[s.number for s, g in zip(judged, grows) if g], message=f"{who} {refilled}")
    run_start, run_end = longest_run(grows)
    if run_end - run_start >= MIN_GROWING and rate > 0:
        at_step = at_time = None
        message = f"{who} grows {fmt_bytes(rate)} per step (median of steps {span})"
        if cap is not None:
            shared = shared_bytes if cap.source == "gpu_total" else 0
            room = cap.cap_bytes - shared - judged[-1].end_live_bytes
            steps_left = max(int(np.ceil(room / rate)), 0)
            at_step = judged[-1].number + steps_left
            at_time = steps_left * step_time
            limit = _CAP_NAMES.get(cap.source, "the cap of {}").format(fmt_bytes(cap.cap_bytes))
            message += (f"; at this rate {limit} is reached at step ~{at_step}, in about "
                        f"{_about(at_time)} more at the median step time of {fmt_duration(step_time)}"
                        if room > 0 else f"; by step {at_step} it held {limit}")
            if shared:
                message += f" (less the {fmt_bytes(shared)} other processes hold on that GPU)"
        return Growth(**base, **judged_fields, verdict="growing", capacity_step=at_step, capacity_time_ns=at_time,
                      step_time_ns=step_time,
                      growing_steps=[s.number for s, g in zip(judged, grows) if g], message=message + _kept_by(holders))
    if judged_fields["total_bytes"] > judged_fields["threshold_bytes"]:
        keeping = [s for s in judged if s.delta_bytes > MIB]
        sizes = sorted({s.delta_bytes for s in keeping})
        each = f" ({fmt_bytes(sizes[0])} each)" if len(sizes) == 1 else ""
        message = (f"{who} keeps memory in some steps, not every step: {_numbers([s.number for s in keeping])}"
                   f"{each}, {fmt_bytes(judged_fields['total_bytes'])} over steps {span}")
        return Growth(**base, **judged_fields, verdict="uneven", capacity_step=None, step_time_ns=step_time,
                      growing_steps=[s.number for s in keeping], message=message + _kept_by(holders))
    return Growth(**base, **judged_fields, verdict="stable", capacity_step=None, step_time_ns=step_time,
                  growing_steps=[s.number for s, g in zip(judged, grows) if g],
                  message=f"{who} {_stable_since(steps, first)}")


def _refilled(steps: list) -> str:
    """"gave 2.2 GiB back in step 3 (torch.cuda.empty_cache() or ...), took it again in steps 4-5
    (+2.5 GiB) and is flat since step 5", when a step gave back more than the threshold and the
    last FLAT_AFTER_FLUSH steps or more after the last such step changed nothing: a caching
    allocator refilling its cache is no leak, however uneven the steps look; else ""."""
    flushes = [i for i, s in enumerate(steps) if s.delta_bytes < -_threshold(s.start_live_bytes)]
    if not flushes:
        return ""
    flush, after = steps[flushes[-1]], steps[flushes[-1] + 1:]
    # the steps at the end that changed nothing
    flat = next((i for i, step in enumerate(reversed(after))
                 if abs(step.delta_bytes) > _threshold(step.start_live_bytes)), len(after))
    if flat < FLAT_AFTER_FLUSH:
        return ""
    text = (f"gave {fmt_bytes(-flush.delta_bytes)} back in step {flush.number} (torch.cuda.empty_cache() or the "
            "allocator releasing its cache)")
    refill = after[:len(after) - flat]
    if refill:
        taken = refill[-1].end_live_bytes - flush.end_live_bytes
        text += f", took {fmt_bytes(taken)} again in steps {_span(refill)}"
    return text + f" and is flat since step {(refill[-1] if refill else flush).number}"


def _quiet(steps: list) -> str:
    """The span of the last steps that allocated and freed nothing at all ("0-4": the caching
    allocator serves every step, or a capture began after warm-up), when at least MIN_JUDGED
    did, else ""."""
    quiet = next((i for i, step in enumerate(reversed(steps)) if step.allocated_bytes or step.freed_bytes),
                 len(steps))
    return _span(steps[len(steps) - quiet:]) if quiet >= MIN_JUDGED else ""


def _stable_since(steps: list, first: int) -> str:
    """"is stable since step 3"; "grew during steps 0-3 (+5.8 GiB), flat since step 3" when it went
    on growing after its first step (a cache warming, a sequence length that grows for a few
    steps): a rise that stops is no leak, and says so; and "nothing allocated or freed in steps
    4-9" when the last steps touched no memory at all."""
    warm = steps[:first]
    quiet = _quiet(steps)
    if len(warm) >= 2 and warm[-1].end_live_bytes - warm[0].end_live_bytes > _threshold(warm[-1].end_live_bytes):
        grew = warm[-1].end_live_bytes - warm[0].start_live_bytes
        sign = "+" if grew >= 0 else "-"
        return (f"grew during steps {warm[0].number}-{warm[-1].number} ({sign}{fmt_bytes(abs(grew))}), "
                f"flat since step {warm[-1].number}" + (f": nothing allocated or freed in steps {quiet}" if quiet else ""))
    if quiet:
        return f"is flat: nothing allocated or freed in steps {quiet}"
    return f"is stable since step {steps[first].number}"


def _about(ns: int) -> str:
    """A projected wait as people say it: "4.2 s", "12 min", "3.5 h", "2.1 days"."""
    seconds = ns / 1e9
    if seconds < 120:
        return fmt_duration(ns)
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _threshold(live_bytes: int) -> int:
    return max(MIB, live_bytes // 100)


def _settled_from(deltas: np.ndarray, live_bytes: int) -> int:
    """Index of the first judged step: the first k >= 1 whose delta is near the steady state (the
    median of the later half), keeping at least MIN_JUDGED steps."""
    later = deltas[1:][len(deltas[1:]) // 2:]
    steady = float(np.median(later))
    tolerance = max(MIB, live_bytes / 100, abs(steady) / 10)
    near = np.flatnonzero(np.abs(deltas[1:] - steady) <= tolerance)
    first = 1 + int(near[0]) if len(near) else 1
    return min(first, len(deltas) - MIN_JUDGED)


def _span(steps: list) -> str:
    return f"{steps[0].number}-{steps[-1].number}" if len(steps) > 1 else str(steps[0].number)


def _numbers(numbers: list[int]) -> str:
    """"steps 2, 5 and 8"."""
    if len(numbers) == 1:
        return f"step {numbers[0]}"
    shown = [str(n) for n in numbers[:8]] + (["..."] if len(numbers) > 8 else [])
    return "steps " + ", ".join(shown[:-1]) + " and " + shown[-1]


def _holders(steps: list, family: str) -> list[Holder]:
    """Who holds the memory the judged steps allocated and never freed, largest first. Labels that
    differ only by numbers ("cudaMalloc in step 2", "... in step 3") are one holder, shown with the
    step's name as the family's ("cudaMalloc in step N")."""
    totals: dict[tuple[str, str], list] = {}
    for step in steps:
        for h in step.kept:  # capped per step
            key = (_DIGITS.sub("N", h.site), _DIGITS.sub("N", h.nvtx_range))
            entry = totals.setdefault(key, [0, 0, h.site.replace(step.name, family),
                                            h.nvtx_range.replace(step.name, family)])
            entry[0] += h.bytes
            entry[1] += h.allocations
    ranked = sorted(totals.values(), key=lambda e: (-e[0], e[2], e[3]))[:MAX_HOLDERS]
    return [Holder(site=site, nvtx_range=name, bytes=b, allocations=n) for b, n, site, name in ranked]


def _kept_by(holders: list[Holder]) -> str:
    if not holders:
        return ""
    parts = [_cut(h.site) + (f" in '{_cut(h.nvtx_range)}'" if h.nvtx_range and h.nvtx_range not in h.site else "")
             + f" ({fmt_bytes(h.bytes)})" for h in holders]
    return "; never freed from these steps: " + ", ".join(parts)


def _cut(label: str) -> str:
    return label if len(label) <= LABEL_CHARS else label[:LABEL_CHARS - 1] + "…"
