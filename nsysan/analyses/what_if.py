"""`--what-if-gpu SIZE`: would this run fit on a GPU of SIZE, and when would it stop fitting?

Works on a finished `Analysis` (its timeline and growth verdicts), so it needs no second pass
over the events and the same answer comes from a report, an export or an analysis.json:
- per GPU, the device + array + static live bytes of every process on it are summed over the
  timeline's series; the first moment that sum goes over SIZE, the process whose step it was and
  the NVTX ranges open on that process's main thread then;
- per growing process, how many more steps SIZE allows at its growth per step.
The timeline keeps every event of a series up to MAX_POINTS events, and the highest and last of
each of 1000 time buckets beyond that: there the moment is the bucket's highest point.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from ..model import GPU_RESIDENT_KINDS, Analysis, Answer
from ..model.steps import WhatIf, WhatIfGpu, WhatIfGrowth
from ..base.units import fmt_bytes, fmt_time
from .graphs import live_at
from .timeline import MAX_POINTS


def what_if_gpu(analysis: Analysis, capacity_bytes: int) -> WhatIf:
    gpus, approximate = [], False
    gpu_of = {(g.pid, g.device): g.gpu for g in analysis.groups}
    by_gpu: dict[tuple, list] = {}
    for s in analysis.timeline.series:
        if s.kind in GPU_RESIDENT_KINDS and s.ts_ns:
            gpu = gpu_of.get((s.pid, s.device))
            by_gpu.setdefault((gpu, s.device if gpu is None else -1), []).append(s)
            approximate |= len(s.ts_ns) >= MAX_POINTS
    for (gpu, device), series in sorted(by_gpu.items(), key=lambda kv: (kv[0][0] is None, kv[0])):
        gpus.append(_replay(analysis, gpu, series[0].device if device == -1 else device, series, capacity_bytes))
    growth = []
    series = {(s.pid, s.device): s for s in analysis.steps}
    for g in analysis.growth:
        if g.verdict == "growing" and g.bytes_per_step > 0 and g.last_step is not None:
            left = max(int(np.ceil((capacity_bytes - g.end_live_bytes) / g.bytes_per_step)), 0)
            at_step = g.last_step + left
            if not left:  # already over it inside the capture: the first step that ended above it
                steps = series.get((g.pid, g.device))
                over = [s.number for s in (steps.steps if steps else []) if s.end_live_bytes > capacity_bytes]
                at_step = over[0] if over else at_step
            growth.append(WhatIfGrowth(pid=g.pid, device=g.device, process=g.process, bytes_per_step=g.bytes_per_step,
                                       end_live_bytes=g.end_live_bytes, steps_allowed=left, at_step=at_step))
    found = WhatIf(capacity_bytes=capacity_bytes, gpus=gpus, growth=growth, approximate=approximate)
    return dataclasses.replace(found, message=_sentence(found, analysis))


def _replay(analysis: Analysis, gpu: Optional[int], device: int, series: list, capacity: int) -> WhatIfGpu:
    """The sum of the series as a step function: each series' level holds until its next point."""
    ts = np.unique(np.concatenate([np.asarray(s.ts_ns, "int64") for s in series]))
    total = live_at(series, ts)
    owner = np.full(len(ts), -1, "int64")  # the process whose point each moment is
    for s in series:
        owner[np.isin(ts, np.asarray(s.ts_ns, "int64"))] = s.pid
    peak = int(total.max()) if len(total) else 0
    over = np.flatnonzero(total > capacity)
    if not len(over):
        return WhatIfGpu(gpu=gpu, device=device, peak_bytes=peak, fits=True)
    first = int(over[0])
    pid = int(owner[first]) if owner[first] >= 0 else None
    return WhatIfGpu(gpu=gpu, device=device, peak_bytes=peak, fits=False, first_over_ns=int(ts[first]),
                     over_bytes=int(total[first]), pid=pid, nvtx_path=_open_ranges(analysis, pid, int(ts[first])))


def _open_ranges(analysis: Analysis, pid: Optional[int], at_ns: int) -> str:
    spans = sorted((s for s in analysis.timeline.spans if s.pid == pid and s.start_ns <= at_ns < s.end_ns),
                   key=lambda s: s.depth)
    if spans:
        return " > ".join(s.name for s in spans)
    bands = [b.name for b in analysis.timeline.bands if b.pid == pid and b.start_ns <= at_ns < b.end_ns]
    return bands[0] if bands else ""


def _sentence(w: WhatIf, analysis: Analysis) -> str:
    size = fmt_bytes(w.capacity_bytes)
    parts = []
    for g in w.gpus:
        where = f"GPU {g.gpu}" if g.gpu is not None else f"CUDA device {g.device}"
        if g.fits:
            parts.append(f"{where} fits: its peak {fmt_bytes(g.peak_bytes)} leaves "
                         f"{fmt_bytes(w.capacity_bytes - g.peak_bytes)} free")
        else:
            who = f" by {analysis.process_label(g.pid)}" if g.pid is not None else ""
            inside = f" in '{g.nvtx_path}'" if g.nvtx_path else ""
            about = "about " if w.approximate else ""
            parts.append(f"{where} would not fit: over it by {fmt_bytes(g.over_bytes - w.capacity_bytes)} at "
                         f"{about}{fmt_time(g.first_over_ns)}{who}{inside} (its peak: {fmt_bytes(g.peak_bytes)})")
    for g in w.growth:
        grows = f"with {g.process}'s growth of {fmt_bytes(g.bytes_per_step)} per step"
        parts.append(f"{grows}, {size} allows {g.steps_allowed} more steps (to step ~{g.at_step})" if g.steps_allowed
                     else f"{grows}, {size} is used up by the end of step {g.at_step}")
    return f"on a {size} GPU: " + "; ".join(parts) if parts else f"on a {size} GPU: no memory events to replay"


# What a GPU of any kind could have: 1 PiB is far beyond every GPU made, and keeps the sums in int64.
LARGEST_GPU_BYTES = 1 << 50


def what_if_bytes(value: "int | str") -> int:
    """`--what-if-gpu SIZE` / `what_if_gpu=` as bytes: a size ("80GiB") or bytes, above 0 and at
    most LARGEST_GPU_BYTES; NsysanError (exit 2) otherwise."""
    from ..errors import NsysanError
    from ..base.units import parse_size

    try:
        number = value if isinstance(value, int) and not isinstance(value, bool) else parse_size(str(value),
                                                                                                 "what-if-gpu")
    except OverflowError:  # a number of hundreds of digits: infinite as a float
        number = LARGEST_GPU_BYTES + 1
    if not 0 < number <= LARGEST_GPU_BYTES:
        raise NsysanError(f"--what-if-gpu {value!s:.40}: give a GPU's memory between 1 B and 1 PiB, like 80GiB")
    return number


def with_what_if(analysis: Analysis, capacity_bytes: int) -> Analysis:
    """The analysis with its `what_if` section and the answer that says it (after the growth)."""
    found = what_if_gpu(analysis, capacity_bytes)
    severity = "warning" if any(not g.fits for g in found.gpus) else "info"
    answer = Answer("what-if", severity, "what_if_gpu", found.message)
    answers = list(analysis.answers)
    after = max((i + 1 for i, a in enumerate(answers) if a.topic in ("peak", "growth")), default=0)
    answers.insert(after, answer)
    return dataclasses.replace(analysis, what_if=found, answers=answers)
